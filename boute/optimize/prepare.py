"""What a search builds before its first proposal, timed on its clock, and built ahead by ``make install``.

A search starts by building its evaluator (:func:`prepared`): the scenario's quality model (the static
embedding table distilled from MiniLM, the routers and, for a cascade, its judge's scores) and its request
stream (the profile's token counts). Each piece is cached on disk (:func:`boute.data.cache_dir`) under a key
of what it is built from, so only the first search on a machine builds it; that search's clock shows the
time as ``prepare``, each build as its sub-phase (:mod:`boute.data.builds`): the built-in scenario's first
run on a cache holding only the static table read ``prepare 10.1 s (router 6.5, tokens 2.1)`` (2 cores, load
8); without the table, distilling it adds a ``static`` sub-phase of 1-2 minutes; after the install step the
first and the second run both read ``prepare 0.5 s`` at load 4-7 (3.5 s and 3.3 s at load 8-10: loading
only). All of it was ``other`` before (issue 50).

``python -m boute.optimize.prepare`` (run by ``make install``) calls the same :func:`prepared` for the built-in
scenarios in both routing modes, so it fills the very cache entries a search reads (one code path, one key
each): a fresh clone's first ``boute optimize`` loads them instead of building them. It is idempotent (a
second run builds nothing) and failure-tolerant: a scenario that cannot be prepared is reported and the others
still are (the RouterBench ones need ``shared/data/routerbench`` beside the project; a profile without
recorded answers has no cascade verifier to train: both are BouteErrors, which a search on them stops on too).
It exits 1 when a preparation failed otherwise (a bug, a broken environment), and ``make install`` then warns
and goes on: a search builds what is missing on first use, as before.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from boute.data.builds import recording
from boute.errors import BouteError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import Evaluator
from boute.optimize.evaluators.factory import make_evaluator
from boute.specs import Scenario


def prepared(clock: SearchClock, name: str, scenario: Scenario, mode: str, seed: int, **options: Any) -> Evaluator:
    """The search evaluator ``name`` (:func:`~boute.optimize.evaluators.factory.make_evaluator`) ready to
    evaluate: with a cascade, its judge's scores of every recorded answer computed (else the first evaluation
    computes them, on the ``evaluate`` clock). Timed as ``prepare``, each first-use build as ``prepare.<kind>``."""
    with clock.timing("prepare"), recording() as built:
        ev = make_evaluator(name, scenario, mode, seed, **options)
        qm = ev.quality_model
        if mode == "cascade" and qm is not None and qm.cascade_scores is not None:
            qm.cascade_scores()  # memoised per quality model (boute.quality.build.cascade_judging)
    for kind, seconds in built.items():
        clock.add(f"prepare.{kind}", seconds)
    return ev


@dataclass(frozen=True)
class Warmed:
    """One scenario and mode prepared ahead: its seconds, what it built (``{kind: seconds}``, empty when the
    cache had everything) and, when it could not be prepared, why: ``skipped`` for a reason a search on it
    would stop on too (a BouteError: its data is absent, its profile has no answers to judge), ``failed``
    for anything else."""

    scenario: str
    mode: str
    seconds: float
    built: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None
    failed: str | None = None

    def line(self) -> str:
        head = f"{self.scenario} ({self.mode}): "
        if self.failed or self.skipped:
            return head + (f"FAILED: {self.failed}" if self.failed else f"skipped: {self.skipped}")
        what = ", ".join(f"{k} {v:.1f} s" for k, v in self.built.items()) if self.built else "nothing, all cached"
        return head + f"{self.seconds:.1f} s, built: {what}"


def warm(scenarios: Sequence[str], modes: Sequence[str]) -> list[Warmed]:
    """Prepare each scenario (a built-in name or a file) in each routing mode, as a search with the
    simulator would (:func:`prepared`); a failure is recorded and the rest go on."""
    from boute.specs import load_scenario

    out: list[Warmed] = []
    for ref in scenarios:
        try:
            sc = load_scenario(ref)
        except BouteError as exc:
            out.extend(Warmed(ref, mode, 0.0, skipped=str(exc)) for mode in modes)
            continue
        for mode in modes:
            clock, t0 = SearchClock(), time.perf_counter()
            try:
                prepared(clock, "sim", sc, mode, seed=0).close()
            except BouteError as exc:
                out.append(Warmed(ref, mode, time.perf_counter() - t0, skipped=str(exc)))
                continue
            except Exception as exc:  # an install step must not stop on it: reported, the search builds later
                out.append(Warmed(ref, mode, time.perf_counter() - t0, failed=f"{type(exc).__name__}: {exc}"))
                continue
            built = {k.split(".", 1)[1]: round(v, 3) for k, v in clock.seconds.items() if k.startswith("prepare.")}
            out.append(Warmed(ref, mode, round(time.perf_counter() - t0, 3), built))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m boute.optimize.prepare [--scenario S]... [--mode M]... [--json]`` (module doc)."""
    from boute.scenarios import builtin_scenarios
    from boute.specs.plan import ROUTING_MODES

    ap = argparse.ArgumentParser(
        prog="python -m boute.optimize.prepare",
        description="Build ahead the caches a first search builds (static embeddings, routers, verifiers, "
        "token counts): the built-in scenarios in every routing mode unless told otherwise.",
    )
    ap.add_argument("--scenario", action="append", help="built-in name or scenario file (repeatable)")
    ap.add_argument("--mode", action="append", choices=ROUTING_MODES, help="routing mode (repeatable)")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    args = ap.parse_args(argv)
    refs = args.scenario or [f"builtin:{name}" for name in builtin_scenarios()]
    t0 = time.perf_counter()
    done = warm(refs, args.mode or list(ROUTING_MODES))
    total = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"seconds": round(total, 3), "prepared": [asdict(w) for w in done]}, indent=2))
    else:
        for w in done:
            print(w.line())
        print(f"prepared in {total:.1f} s (cache: {_cache()})")
    return 1 if any(w.failed for w in done) else 0


def _cache() -> str:
    from boute.data import cache_dir

    return str(cache_dir())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
