"""The re-planning loop around a running deployment: observe, decide, re-plan, roll out, record.

Composition of the pieces in ``boute.replan`` (windows, drift detection, the observed scenario, warm start,
the rollout rule) and the optimiser's typed entry point, :func:`boute.optimize.plan_run.make_plan`, run in a
worker process (:class:`~boute.optimize.plan_run.PlanWorker`) so a search that crashes never takes the loop
down. A re-plan answers with a :class:`Replanned`: the status, the new plan or the typed error that stopped
it (``InfeasibleError``, ``UnconfirmedError``, ``WorkerError``, a rollout's ``BouteError``), with its reason.
The rollout itself is the caller's (``roll_out``: the deployer lives outside the core). Every decision is
recorded in the tracking DB.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from boute.errors import BouteError, InfeasibleError
from boute.optimize.plan_run import PlanRequest, PlanRun, PlanWorker
from boute.replan.decide import Judged, decide
from boute.replan.drift import DriftDetector, Promise, Thresholds, Trigger
from boute.replan.observed import healthy_deployment, observed_scenario, promise_of, running_fractions
from boute.replan.window import Snapshot, Window, merge, read_snapshots
from boute.serving import RedisKeys
from boute.serving.bundle import open_plan, plan_scenario
from boute.specs import Plan, Scenario

if TYPE_CHECKING:
    from boute.optimize.evaluators import EvalResult, FastEvaluator
    from boute.specs.plan import Prediction

#: the deployment's current plan and its config (written by ``boute deploy up``)
DESIRED, CONFIG = "desired.json", "config.json"
#: intervals of the most recent traffic whose rate a re-plan sizes for
RECENT_INTERVALS = 3

#: the plan a re-plan made, in the deployment's folder -> it is live (raises BouteError when it is not)
RollOut = Callable[[Path], None]
#: a plan request -> the plan made (raises InfeasibleError, UnconfirmedError, WorkerError, BouteError)
Planner = Callable[[PlanRequest], PlanRun]


def recent_span(snaps: list[Snapshot], window_s: float) -> float:
    """Seconds covered by the last few gateway intervals: the freshest rate estimate that is not one sample."""
    if not snaps:
        return window_s
    interval = float(np.median([s.t1 - s.t0 for s in snaps[:20]]))
    return min(window_s, RECENT_INTERVALS * interval + 0.5 * interval)


@dataclass(frozen=True)
class Replanned:
    """One re-plan: what was recorded, the plan the search made (None when it made none) and the typed error
    that ended the round early (None when it did not). ``status``: deployed | proposed | kept | infeasible |
    failed."""

    status: str
    record: dict[str, Any]
    run: PlanRun | None = None
    error: BouteError | None = None


class Autopilot:
    """Watches one deployment folder (``boute deploy up`` wrote its plan and config there) and re-plans it."""

    def __init__(
        self,
        directory: Path,
        *,
        db: str,
        thresholds: Thresholds,
        window_s: float,
        max_evals: int,
        dry_run: bool,
        warm_from: list[str],
        say: Callable[[str], None],
        roll_out: RollOut | None = None,
        planner: Planner | None = None,
    ) -> None:
        """``roll_out``: required unless ``dry_run``. ``planner``: how a plan is made (default: a worker
        process running :func:`~boute.optimize.plan_run.make_plan`, started on the first re-plan)."""
        if roll_out is None and not dry_run:
            raise BouteError("replan: a rollout is needed unless it is a dry run")
        self.dir, self.db, self.window_s, self.max_evals = directory, db, window_s, max_evals
        self.dry_run, self.say, self.roll_out = dry_run, say, roll_out
        self._worker: PlanWorker | None = None
        self.planner: Planner = planner or self._in_worker
        cfg_path = directory / CONFIG
        if not cfg_path.is_file():
            raise BouteError(f"{directory}: no deployment here ({CONFIG} missing): `boute deploy up` one first")
        self.cfg = json.loads(cfg_path.read_text())
        self.key = RedisKeys(self.cfg.get("prefix", "boute")).observations
        self.redis_url = str(self.cfg["redis_url"])
        self.plan, self.sc = self._load(directory / DESIRED)
        #: the first plan's prompt scale: a re-plan's scenario scales prompts beyond its reference's by its own
        #: over this (the promise's prompt lengths follow; the reference stays the profile's)
        self.base_input_scale = self.sc.workload.lengths.input_scale
        self.detector = DriftDetector(self._promise(self.plan, directory / DESIRED), thresholds)
        self.warm_from = warm_from
        self.rounds = 0

    def _in_worker(self, req: PlanRequest) -> PlanRun:
        if self._worker is None:
            self._worker = PlanWorker()
        return self._worker.run(req)

    def close(self) -> None:
        """Stop the search worker, if one was started."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> Autopilot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _load(path: Path) -> tuple[Plan, Scenario]:
        plan = open_plan(path)
        sc = plan_scenario(plan, path)
        if sc is None:
            raise BouteError(f"{path}: scenario_spec: missing; re-planning needs a plan written by boute optimize")
        return plan, sc

    def _promise(self, plan: Plan, path: Path, rate_rps: float | None = None) -> Promise:
        """The plan's promise in this loop's units: windows of ``window_s``, prompts as the plan assumes them."""
        p = promise_of(plan, path, rate_rps=rate_rps, window_s=self.window_s)
        shift = self.sc.workload.lengths.input_scale / self.base_input_scale
        return dataclasses.replace(p, prompt_chars=p.prompt_chars * shift)

    def window(self, now: float | None = None, span_s: float | None = None) -> Window:
        now = time.time() if now is None else now
        return merge(read_snapshots(self.redis_url, self.key), now, span_s or self.window_s)

    def step(self, now: float | None = None) -> list[Trigger]:
        """One check: judge the window; on a trigger, re-plan (and roll out unless dry-run)."""
        now = time.time() if now is None else now
        snaps = read_snapshots(self.redis_url, self.key)
        w = merge(snaps, now, self.window_s)
        fired = self.detector.check(w, now)
        for t in fired:
            self.say(f"trigger {t.line()}")
        if fired:
            # the window still mixes the traffic before a change with after it: size for the recent rate
            recent = merge(snaps, now, recent_span(snaps, self.window_s))
            self.replan(w, fired, now, rate_rps=max(w.rate_rps, recent.rate_rps))
        return fired

    def replan(self, w: Window, fired: list[Trigger], t_trigger: float, rate_rps: float | None = None) -> Replanned:
        """Plan for the observed workload on the healthy fleet, warm-started; judge the new plan against the
        running one (:func:`boute.replan.decide.decide`) and roll it out, propose it (dry run) or keep the
        running one. Every outcome is recorded and returned."""
        from boute.optimize.evaluators import FastEvaluator
        from boute.optimize.objectives import Objective
        from boute.optimize.settings import SearchSettings
        from boute.optimize.space import Candidate
        from boute.replan.warm import seed_experiment, warm_trials
        from boute.sim import plan_cost
        from boute.specs import load_scenario
        from boute.specs.io import write_atomic
        from boute.specs.scenario import with_affinity
        from boute.tracking import open_store

        self.rounds += 1
        n, stamp = self.rounds, time.strftime("%Y%m%dT%H%M%S")
        # every length shift the detector holds, not only this check's: a shift acknowledged earlier is still there
        shifted = {t.kind for t in fired} | self.detector.active
        obs = observed_scenario(
            self.sc, self.plan, w, self.detector.promise, self.detector.answer_baseline, shifted, rate_rps=rate_rps
        )
        # the running plan's balancing: a user who turned prefix affinity on keeps it, and the search judges by it
        obs = with_affinity(obs, self.plan.affinity)
        # beside the plan: the scenario's relative file references (the bundle) resolve from there, and the
        # file is the record of what this round planned for (the search worker reads it too)
        obs_file = self.dir / f"observed-{n}.yaml"
        write_atomic(obs_file, yaml.safe_dump(obs.model_dump(mode="json", exclude_none=True), sort_keys=False))
        obs = load_scenario(obs_file)
        # the running plan's own terms: its routing mode and the objective that chose it
        mode = self.plan.routing.mode
        objective = Objective.from_label(self.plan.objective)
        fast = FastEvaluator(obs, mode=mode)
        # the running plan as it stands (lost replicas gone), under the observed workload: the gain's baseline
        standing = healthy_deployment(self.plan, w)
        old = Candidate(running_fractions(self.plan, obs), tuple(standing), float(plan_cost(standing, obs)))
        try:
            before = fast(old) if self.plan.routing.fractions and standing else None
        except BouteError:  # e.g. a loaded tier left with no replica
            before = None
        store = open_store(self.db)
        name = f"replan-{obs.name}-{stamp}-{n}"
        try:
            warm = warm_trials(store, self.warm_from, obs, fast, first=[old] if standing else [])
            search = SearchSettings(
                experiment=name,
                max_evals=len(warm) + self.max_evals,
                mode=mode,
                objective=objective.name,
                prefer=objective.prefer_option,
                # a re-plan answers a trigger: the fast path searches on from the warm trials it scored (one
                # evaluator per experiment), and the simulator confirms before anything is proposed or rolled out
                evaluator="fast",
            )
            seed_experiment(store, obs, warm, search)
        finally:
            store.close()
        req = PlanRequest(out=self.dir / f"replan-{n}" / "plan.json", scenario=str(obs_file), db=self.db, search=search)
        record: dict[str, Any] = {
            "deployment": str(self.dir),
            "triggers": [{"kind": t.kind, "at": t.at, "evidence": json_safe(t.evidence)} for t in fired],
            "old_plan": self.plan.model_dump(mode="json", exclude_none=True),
            "observed": json_safe(w.summary()),
            "experiment": name,
        }
        t0 = time.monotonic()
        try:
            run = self.planner(req)
        except BouteError as exc:  # typed: no plan meets the targets, none confirmed, or the search broke
            status = "infeasible" if isinstance(exc, InfeasibleError) else "failed"
            self.say(f"re-plan {n}: no plan ({type(exc).__name__}: {exc}); keeping the running one")
            record |= {"status": status, "detail": str(exc)}
            self._record(record)
            self.detector.quiet(time.time())  # do not retry at once
            return Replanned(status, record, error=exc)
        search_s = time.monotonic() - t0
        return self._judge(run, obs, fast, before, w, fired, t_trigger, record, warm=len(warm), search_s=search_s)

    def _judge(
        self,
        run: PlanRun,
        obs: Scenario,
        fast: FastEvaluator,
        before: EvalResult | None,
        w: Window,
        fired: list[Trigger],
        t_trigger: float,
        record: dict[str, Any],
        *,
        warm: int,
        search_s: float,
    ) -> Replanned:
        """The new plan against the running one under the observed load, then deploy, propose or keep."""
        from boute.optimize.space import Candidate
        from boute.sim import plan_cost

        n, new, out = self.rounds, run.plan, run.path
        after = fast(
            Candidate(
                tuple(new.routing.fractions or ()), tuple(new.deployment), float(plan_cost(list(new.deployment), obs))
            )
        )
        verdict = decide(
            fired,
            w,
            self.plan.objective,
            None if before is None else Judged(before.p95_latency_s, before.cost_per_hour, before.feasible),
            Judged(after.p95_latency_s, after.cost_per_hour, after.feasible),
        )
        record |= {
            "new_plan": new.model_dump(mode="json", exclude_none=True),
            "gain": json_safe(gain_record(before, after, new.predicted, warm=warm, search_s=search_s)),
            "detail": verdict.reason,
        }
        if not verdict.roll_out:
            self.say(f"re-plan {n}: the running plan stays ({verdict.reason})")
            record |= {"status": "kept", "wall_s": time.time() - t_trigger}
            self._record(record)
            self.detector.acknowledged(self._promise(self.plan, self.dir / DESIRED, rate_rps=obs.workload.rate_rps))
            return Replanned("kept", record, run)
        if self.dry_run or self.roll_out is None:
            self.say(f"re-plan {n} proposed (dry run; {verdict.reason}): {out}")
            record |= {"status": "proposed", "wall_s": time.time() - t_trigger}
            self._record(record)
            self.detector.quiet(time.time())
            return Replanned("proposed", record, run)
        try:
            self.roll_out(out)
        except BouteError as exc:
            self.say(f"re-plan {n}: rollout failed ({exc})")
            record |= {"status": "failed", "detail": f"rollout failed: {exc}", "wall_s": time.time() - t_trigger}
            self._record(record)
            # the rollout may have written the new desired plan before its wait failed: the controller then
            # converges on it, so judge against whatever desired.json now holds (and stay quiet a while)
            self.plan, self.sc = self._load(self.dir / DESIRED)
            self.detector.replanned(self._promise(self.plan, self.dir / DESIRED), time.time())
            return Replanned("failed", record, run, exc)
        live = time.time()
        self.plan, self.sc = self._load(self.dir / DESIRED)
        self.detector.replanned(self._promise(self.plan, self.dir / DESIRED), live)
        self.warm_from = [str(record["experiment"])]
        self.say(f"re-plan {n} live after {live - t_trigger:.1f} s (search {search_s:.1f} s; {verdict.reason}): {out}")
        record |= {"status": "deployed", "wall_s": live - t_trigger}
        self._record(record)
        return Replanned("deployed", record, run)

    def _record(self, row: dict[str, Any]) -> None:
        from boute.tracking import open_store

        store = open_store(self.db)
        try:
            store.add_replan(row)
        finally:
            store.close()


def gain_record(
    before: EvalResult | None, after: EvalResult, pred: Prediction | None, *, warm: int, search_s: float
) -> dict[str, Any]:
    """What a re-plan's record says it gains: the old and the new plan judged under the observed load, the
    new plan's own prediction, the warm trials the search started from and how long it ran."""
    return {
        "warm_trials": warm,
        "search_s": round(search_s, 2),
        "old_under_observed": None if before is None else {
            "p95_latency_s": before.p95_latency_s, "cost_per_hour": before.cost_per_hour, "feasible": before.feasible,
        },
        "new_under_observed": {
            "p95_latency_s": after.p95_latency_s, "cost_per_hour": after.cost_per_hour, "feasible": after.feasible,
        },
        "new_predicted": None if pred is None else {
            "p95_latency_s": pred.p95_latency_s, "cost_per_hour": pred.cost_per_hour, "quality": pred.quality,
        },
    }  # fmt: skip


def json_safe(value: Any) -> Any:
    """Numbers as plain floats (NaN/inf as None), arrays as lists: what a JSON column takes."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
