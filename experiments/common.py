"""Shared plumbing of the experiments: presets, scenarios, evaluators, result files and tracking rows.

Every experiment writes three things, all stamped with the command, seed and scenario that produced them:
``experiments/results/<name>.json`` (the raw figures, which the README generator reads), markdown tables
and PNG plots beside it, and one tracking-DB experiment per result row (``boute experiments list`` shows
them). The DB defaults to ``experiments/results/experiments.db`` (git-ignored); ``--db`` takes any URL.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SCENARIOS = HERE / "scenarios"
RESULTS = HERE / "results"
PRESETS = ("full", "quick", "tiny")


@dataclass
class Context:
    """What one invocation runs under: preset (full / quick / tiny), seed, output folder, DB URL."""

    preset: str = "full"
    seed: int = 0
    results: Path = RESULTS
    db: str | None = None
    command: str = field(default_factory=lambda: " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    run_id: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    _store: Any = None

    @property
    def quick(self) -> bool:
        return self.preset != "full"

    def pick(self, full: Any, quick: Any, tiny: Any) -> Any:
        """The setting for this preset."""
        return {"full": full, "quick": quick, "tiny": tiny}[self.preset]

    def store(self) -> Any:
        if self._store is None:
            from boute.tracking import open_store

            self.results.mkdir(parents=True, exist_ok=True)
            self._store = open_store(self.db or f"sqlite:///{self.results / 'experiments.db'}")
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def stamp(self, scenario: str | None = None) -> dict[str, Any]:
        """Provenance attached to every result: command, preset, seed, scenario, run id."""
        return {
            "command": self.command,
            "preset": self.preset,
            "seed": self.seed,
            "scenario": scenario,
            "run_id": self.run_id,
        }


# ---- scenarios and evaluators -------------------------------------------------------------------------
def load(name: str, ctx: Context | None = None) -> Any:
    """An experiment scenario by file stem; tiny/quick presets shorten the simulated horizon."""
    from boute.specs import load_scenario

    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    if ctx is not None and ctx.preset != "full":
        horizon = ctx.pick(60.0, 20.0, 8.0)
        wl = sc.workload.model_copy(update={"duration_s": horizon})
        sc = sc.model_copy(update={"workload": wl})
    return sc


def with_budget(scenario: Any, budget: float) -> Any:
    from boute.optimize.plan_run import with_targets

    return with_targets(scenario, budget, None, None)


@dataclass
class Evaluators:
    """Fast and simulator evaluators of one scenario sharing one quality model (per routing mode); ``seed``
    is the simulator's (its workload draw), the same one a search's worker processes rebuild it with."""

    scenario: Any
    mode: str = "preroute"
    seed: int = 0
    _fast: Any = None
    _sim: Any = None

    @property
    def fast(self) -> Any:
        if self._fast is None:
            from boute.optimize.evaluators import FastEvaluator

            self._fast = FastEvaluator(self.scenario, self.mode)
        return self._fast

    @property
    def sim(self) -> Any:
        if self._sim is None:
            from boute.optimize.evaluators import SimEvaluator

            self._sim = SimEvaluator(self.scenario, self.mode, quality_model=self.fast.quality_model, seed=self.seed)
        return self._sim

    @property
    def quality_model(self) -> Any:
        return self.fast.quality_model

    def search(self, **runtime: Any) -> Any:
        """What runs BOute's search as ``boute optimize`` runs it by default (:func:`boute.optimize.plan_run.make_plan`):
        the simulator is the objective, the fast path the prior its GP corrects; with the defaults of
        :class:`boute.optimize.settings.SearchSettings` (proposals in batches of 4, one worker process per
        core). A :class:`boute.optimize.session.SearchRuntime` (``runtime``: its other fields); the
        simulator's choice is its own confirmation."""
        from boute.optimize.session import SearchRuntime

        return SearchRuntime(evaluator=self.sim, prior=self.fast, **runtime)

    def fast_of(self, cand: Any, result: Any) -> Any:
        """The fast path's result for ``cand``: ``result`` itself when the fast path produced it (a baseline's
        search), else a fresh fast evaluation (BOute's simulator search), for the figures only it has."""
        return result if result is not None and result.evaluator == "fast" else self.fast(cand)

    def sim_of(self, cand: Any, result: Any) -> Any:
        """The simulator's result for ``cand``: ``result`` when the simulator produced it, else a simulation."""
        return result if result is not None and result.evaluator == "sim" else self.sim(cand)

    def policy(self, fractions: Any) -> Any:
        from boute.optimize.evaluators import policy_of

        return policy_of(self.fast.quality_model, self.mode, tuple(fractions))

    def at_budget(self, budget: float) -> Evaluators:
        """The same evaluators judging feasibility against another budget (workload unchanged)."""
        sc = with_budget(self.scenario, budget)
        out = Evaluators(sc, self.mode, self.seed)
        out._fast = copy.copy(self.fast)
        out._fast.scenario = sc
        if self._sim is not None:
            out._sim = copy.copy(self._sim)
            out._sim.scenario = sc
        return out


# ---- result files ---------------------------------------------------------------------------------------
def clean(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, tuples lists, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save_json(ctx: Context, name: str, doc: dict[str, Any]) -> Path:
    from boute.specs.io import write_atomic

    ctx.results.mkdir(parents=True, exist_ok=True)
    path = ctx.results / f"{name}.json"
    write_atomic(path, json.dumps(clean(doc), indent=1) + "\n")
    return path


def load_json(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def save_markdown(ctx: Context, name: str, text: str) -> Path:
    from boute.specs.io import write_atomic

    ctx.results.mkdir(parents=True, exist_ok=True)
    path = ctx.results / f"{name}.md"
    write_atomic(path, text.rstrip() + "\n")
    return path


def new_figure(width: float = 6.4, height: float = 4.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100)


def save_figure(ctx: Context, fig: Any, name: str) -> Path:
    import matplotlib.pyplot as plt

    ctx.results.mkdir(parents=True, exist_ok=True)
    path = ctx.results / f"{name}.png"
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


# ---- tracking DB ----------------------------------------------------------------------------------------
def record(
    ctx: Context,
    experiment: str,
    scenario: str,
    system: str,
    metrics: dict[str, Any],
    *,
    evaluator: str = "fast+sim",
    plan: dict[str, Any] | None = None,
) -> str:
    """One tracking-DB experiment holding one result row (named ``exp/<experiment>/<scenario>/<system>/...``)."""
    from boute.optimize.status import ExperimentStatus

    store = ctx.store()
    name = f"exp/{experiment}/{scenario}/{system}/s{ctx.seed}/{ctx.preset}/{ctx.run_id}"
    exp, _ = store.open_experiment(
        name,
        scenario=scenario,
        strategy=system[:40],
        evaluator=evaluator,
        seed=ctx.seed,
        settings=clean({"experiment": experiment, **ctx.stamp(scenario)}),
    )
    store.set_status(exp.id, ExperimentStatus.COMPLETE, result=clean(metrics))
    if plan is not None:
        store.add_plan(exp.id, None, clean(plan), clean(metrics), None, None)
    return name


class Timer:
    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0


def deployment_text(deployment: Any) -> str:
    """Short human form: ``small: 4x rtx-4090 tp1; large: 2x h100-sxm tp4``."""
    parts: dict[str, list[str]] = {}
    for g in deployment:
        cfg = f"tp{g.tp}" + (f"pp{g.pp}" if g.pp > 1 else "")
        parts.setdefault(g.tier, []).append(f"{g.count}x {g.gpu} {cfg}")
    return "; ".join(f"{t}: {', '.join(v)}" for t, v in parts.items())
