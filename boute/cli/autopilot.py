"""The re-planning loop around a running deployment: observe, decide, re-plan, roll out, record.

Composition only: it drives ``boute optimize`` and ``boute deploy up`` as a user would, in child processes
(a failed search never takes the loop down); the pieces live in ``boute.replan`` (windows, drift
detection, the observed scenario, warm start). Every decision is recorded in the tracking DB.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from boute.errors import BouteError
from boute.replan.decide import Judged, decide
from boute.replan.drift import DriftDetector, Promise, Thresholds, Trigger
from boute.replan.observed import healthy_deployment, observed_scenario, promise_of, running_fractions
from boute.replan.window import Window, merge, read_snapshots
from boute.serving import RedisKeys
from boute.serving.bundle import open_plan, plan_scenario
from boute.specs import Plan, Scenario

#: the deployment's current plan and its config (written by ``boute deploy up``)
DESIRED, CONFIG = "desired.json", "config.json"
#: intervals of the most recent traffic whose rate a re-plan sizes for
RECENT_INTERVALS = 3


def recent_span(snaps: list[Any], window_s: float) -> float:
    """Seconds covered by the last few gateway intervals: the freshest rate estimate that is not one sample."""
    if not snaps:
        return window_s
    interval = float(np.median([s.t1 - s.t0 for s in snaps[:20]]))
    return min(window_s, RECENT_INTERVALS * interval + 0.5 * interval)


def _boute(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *argv], capture_output=True, text=True, check=False)


class Autopilot:
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
    ) -> None:
        self.dir, self.db, self.window_s, self.max_evals = directory, db, window_s, max_evals
        self.dry_run, self.say = dry_run, say
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

    def replan(
        self, w: Window, fired: list[Trigger], t_trigger: float, rate_rps: float | None = None
    ) -> dict[str, Any]:
        from boute.optimize.evaluators import FastEvaluator
        from boute.optimize.objectives import make_objective
        from boute.optimize.space import Candidate
        from boute.replan.warm import seed_experiment, warm_trials
        from boute.sim import plan_cost
        from boute.specs import load_scenario
        from boute.specs.io import write_atomic
        from boute.tracking import open_store

        self.rounds += 1
        n, stamp = self.rounds, time.strftime("%Y%m%dT%H%M%S")
        # every length shift the detector holds, not only this check's: a shift acknowledged earlier is still there
        shifted = {t.kind for t in fired} | self.detector.active
        obs = observed_scenario(
            self.sc, self.plan, w, self.detector.promise, self.detector.answer_baseline, shifted, rate_rps=rate_rps
        )
        # beside the plan: the scenario's relative file references (the bundle) resolve from there
        obs_file = self.dir / f"observed-{n}.yaml"
        write_atomic(obs_file, yaml.safe_dump(obs.model_dump(mode="json", exclude_none=True), sort_keys=False))
        obs = load_scenario(obs_file)
        # the running plan's own terms: its routing mode and the objective that chose it
        mode = self.plan.routing.mode
        objective = make_objective(*(self.plan.objective or "latency").split(":", 1))
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
            seed_experiment(store, name, obs, warm, mode=mode, objective=objective)
        finally:
            store.close()
        out = self.dir / f"replan-{n}" / "plan.json"
        t0 = time.monotonic()
        r = _boute(
            "optimize", "--scenario", str(obs_file), "--experiment", name, "--db", self.db, "-q",
            "--max-evals", str(len(warm) + self.max_evals), "--out", str(out), "--mode", mode,
            "--objective", objective.name, *(["--prefer", objective.prefer] if objective.name == "pareto" else []),
        )  # fmt: skip
        search_s = time.monotonic() - t0
        record: dict[str, Any] = {
            "deployment": str(self.dir),
            "triggers": [{"kind": t.kind, "at": t.at, "evidence": _json_safe(t.evidence)} for t in fired],
            "old_plan": self.plan.model_dump(mode="json", exclude_none=True),
            "observed": _json_safe(w.summary()),
            "experiment": name,
        }
        if r.returncode != 0:
            reason = (r.stderr.strip().splitlines() or ["optimize failed"])[-1]
            self.say(f"re-plan {n}: no plan ({reason}); keeping the running one")
            self._record(record | {"status": "infeasible" if r.returncode == 2 else "failed", "detail": reason})
            self.detector.quiet(time.time())  # do not retry at once
            return record
        new = open_plan(out)
        pred = new.predicted
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
        gain = {
            "warm_trials": len(warm),
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
        record |= {
            "new_plan": new.model_dump(mode="json", exclude_none=True),
            "gain": _json_safe(gain),
            "detail": verdict.reason,
        }
        if not verdict.roll_out:
            self.say(f"re-plan {n}: the running plan stays ({verdict.reason})")
            self._record(record | {"status": "kept", "wall_s": time.time() - t_trigger})
            self.detector.acknowledged(self._promise(self.plan, self.dir / DESIRED, rate_rps=obs.workload.rate_rps))
            return record
        if self.dry_run:
            self.say(f"re-plan {n} proposed (dry run; {verdict.reason}): {out}")
            self._record(record | {"status": "proposed", "wall_s": time.time() - t_trigger})
            self.detector.quiet(time.time())
            return record
        d = _boute("deploy", "up", str(out), "--dir", str(self.dir), "--target", str(self.cfg.get("target", "local")))
        if d.returncode != 0:
            reason = (d.stderr.strip().splitlines() or ["deploy failed"])[-1]
            self.say(f"re-plan {n}: rollout failed ({reason})")
            self._record(
                record | {"status": "failed", "detail": f"rollout failed: {reason}", "wall_s": time.time() - t_trigger}
            )
            # `deploy up` may have written the new desired plan before its wait failed: the controller then
            # converges on it, so judge against whatever desired.json now holds (and stay quiet a while)
            self.plan, self.sc = self._load(self.dir / DESIRED)
            self.detector.replanned(self._promise(self.plan, self.dir / DESIRED), time.time())
            return record
        live = time.time()
        self.plan, self.sc = self._load(self.dir / DESIRED)
        self.detector.replanned(self._promise(self.plan, self.dir / DESIRED), live)
        self.warm_from = [name]
        self.say(f"re-plan {n} live after {live - t_trigger:.1f} s (search {search_s:.1f} s; {verdict.reason}): {out}")
        self._record(record | {"status": "deployed", "wall_s": live - t_trigger})
        return record

    def _record(self, row: dict[str, Any]) -> None:
        from boute.tracking import open_store

        store = open_store(self.db)
        try:
            store.add_replan(row)
        finally:
            store.close()


def _json_safe(value: Any) -> Any:
    """Numbers as plain floats (NaN/inf as None), arrays as lists: what a JSON column takes."""
    import math

    import numpy as np

    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
