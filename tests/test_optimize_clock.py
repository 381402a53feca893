"""Where a search's time goes (boute/optimize/clock.py): phases timed by the loop, MOBO's own split of its
proposals, and the one-line breakdown the progress bar and the summary show."""

from __future__ import annotations

import time

from boute.optimize.clock import SearchClock, breakdown
from boute.optimize.evaluators.fast import FastEvaluator
from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.strategies.factory import make_strategy
from boute.specs import load_scenario


def test_breakdown_orders_phases_nests_sub_phases_and_shows_the_rest_as_other() -> None:
    s = {"evaluate": 4.0, "propose.fit": 1.0, "propose": 3.0, "setup": 0.5, "record": 0.01, "propose.pool": 1.5}
    assert breakdown(s) == "setup 0.5 s, propose 3.0 s (fit 1.0, pool 1.5), evaluate 4.0 s"
    assert breakdown(s, detail=False) == "setup 0.5 s, propose 3.0 s, evaluate 4.0 s"
    assert breakdown(s, wall_s=10.0).endswith(", other 2.5 s")  # 10 - (0.5 + 3 + 4 + 0.01)
    assert breakdown({}) == "nothing timed yet"


def test_a_phase_is_timed_however_its_block_ends() -> None:
    clock = SearchClock()
    try:
        with clock.timing("evaluate"):
            time.sleep(0.02)
            raise RuntimeError("an evaluation failed")
    except RuntimeError:
        pass
    with clock.timing("evaluate"):
        pass
    assert clock.seconds["evaluate"] >= 0.02
    assert list(SearchClock({"record": 1.0, "setup": 2.0, "propose.fit": 0.5}).snapshot()) == [
        "setup",
        "propose.fit",
        "record",
    ]


def test_the_loop_times_every_phase_and_mobo_splits_its_proposals() -> None:
    sc = load_scenario(None)
    space = Space.build(sc)
    ev = FastEvaluator(sc)
    clock = SearchClock()
    t0 = time.perf_counter()
    trials = run_search(
        space,
        ev,
        make_strategy("mobo", space, 0),
        SearchSettings(max_evals=16, batch=4, patience=None),
        screen=Screen.build(space, ev.quality_model, ev.mode),
        hooks=LoopHooks(on_trial=lambda t: None, clock=clock),
    )
    wall = time.perf_counter() - t0
    s = clock.seconds
    assert sum(t.evaluated for t in trials) == 16
    assert {"propose", "screen", "evaluate", "record"} <= set(s)
    assert {"propose.fit", "propose.pool", "propose.acquisition"} <= set(s)  # MOBO's steps past its design
    assert s["propose.fit"] + s["propose.pool"] + s["propose.acquisition"] <= s["propose"] + 1e-6  # nested in it
    assert s["propose"] + s["screen"] + s["evaluate"] + s["record"] <= wall + 1e-6  # disjoint phases of the run
