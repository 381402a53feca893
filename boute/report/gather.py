"""An experiment's report gathered from the tracking DB: :func:`gather` reads the store once (the only I/O
here), the functions below it turn the rows into :class:`~boute.report.model.Report` values, each a pure
function of what it is given.

* The front: the search's evaluated plans that gave a result, and the quality x P95 x $/h front of those
  meeting the targets (:func:`boute.optimize.trials.pareto_front` with the ``pareto`` objective, whatever
  objective chose the plan: the report always shows the three-way trade-off).
* Progress: after each evaluation, the best feasible plan so far on the objective's own figure: its P95
  (``latency``), its $/h (``cost``) or, for ``pareto``, the hypervolume the feasible plans dominate in
  (quality, -log P95, -$/h) above (floor, -log cap, -budget) (:func:`boute.optimize.trials.hypervolume3`),
  against evaluations and against the run's wall time (``trials.elapsed_s``). The experiments compared
  are the ones of the same search problem (:data:`SAME_PROBLEM`: scenario, targets, objective, routing
  mode, perf model, evaluator) whatever their strategy and seed.
* Where the time went: the run's phases (:mod:`boute.optimize.clock`), recorded with the experiment.
* The plan: the latest one the experiment wrote, its replica groups priced as the optimiser prices them
  (replicas x TP x PP x the GPU's $/h, the scenario's price overrides first).
* The verification: the latest ``boute verify`` recorded against that plan (its verdict and how the
  replay ran).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from boute.errors import BouteError
from boute.optimize.clock import PHASES, top_level
from boute.optimize.objectives import Objective
from boute.optimize.records import trial_from_row
from boute.optimize.status import CONFIRMING, TrialStatus
from boute.optimize.trial_store import StoredTrial
from boute.optimize.trials import Trial, pareto_front
from boute.report.model import (
    CheckRow,
    ChosenPlan,
    Curve,
    ExperimentInfo,
    GroupBox,
    Phase,
    Point,
    Progress,
    Report,
    TierBox,
    Verification,
)
from boute.specs.targets import Targets
from boute.tracking.models import Experiment
from boute.tracking.store import Store

#: the experiment settings (``boute.optimize.experiment.settings_of``) that make two searches the same problem:
#: their progress can be compared, whatever strategy and seed each ran with
SAME_PROBLEM = ("scenario_sha", "perf_sha", "budget_per_hour", "quality_floor", "p95_cap_s", "mode", "objective")

#: the progress figure of each objective (module doc)
PROGRESS = {
    "latency": Progress("p95", "best feasible P95, s (log)", lower_is_better=True, log_scale=True),
    "cost": Progress("cost", "best feasible cost, $/h", lower_is_better=True, log_scale=False),
    "pareto": Progress(
        "hypervolume", "feasible hypervolume (q, -log P95, -$/h)", lower_is_better=False, log_scale=False
    ),
}


def gather(store: Store, ref: str | int | None) -> Report:
    """The report of experiment ``ref`` (name or id; None: the newest) in ``store``, with the latest
    verification of its latest plan. BouteError when there is no such experiment."""
    exp = _experiment(store, ref)
    rows = store.trial_rows(exp.id)
    plans = store.plans(exp.id)
    plan_row = plans[-1] if plans else None
    verdict = None
    if plan_row is not None:
        recorded = [v for v in store.verifications(exp.id) if v.plan_id == plan_row.id]
        if recorded:
            v = recorded[-1]
            verdict = {**v.verdict, **v.info, "at": v.created_at.isoformat(timespec="seconds")}
    others = [(e, store.trial_rows(e.id)) for e in _all_experiments(store) if e.id != exp.id and same_problem(exp, e)]
    plan_doc = (
        None if plan_row is None else (_as_written(plan_row.plan, plan_row.path), plan_row.trial_index, plan_row.path)
    )
    return build_report(exp, rows, others, plan_doc, verdict)


def _as_written(doc: dict[str, Any], path: str | None) -> dict[str, Any]:
    """The recorded plan with its scenario: rows recorded before plans were recorded as written hold only what
    was built, so the plan file at the recorded path is read instead when it is still there and is that
    plan (same creation time and deployment)."""
    if doc.get("scenario_spec") or not path or not Path(path).is_file():
        return doc
    from boute.specs.io import read_mapping

    try:
        written = dict(read_mapping(path))
    except BouteError:
        return doc
    same = all(written.get(k) == doc.get(k) for k in ("created_at", "deployment"))
    return written if same else doc


def _experiment(store: Store, ref: str | int | None) -> Experiment:
    if ref is None:
        listed = store.experiments()
        if not listed:
            raise BouteError("report: the tracking DB holds no experiment (run boute optimize first)")
        ref = int(listed[-1]["id"])
    exp = store.experiment(ref)
    if exp is None:
        raise BouteError(f"report: no experiment named or numbered '{ref}'")
    return exp


def _all_experiments(store: Store) -> list[Experiment]:
    out: list[Experiment] = []
    for e in store.experiments():
        got = store.experiment(int(e["id"]))
        if got is not None:
            out.append(got)
    return out


def same_problem(a: Experiment, b: Experiment) -> bool:
    """Whether two experiments searched the same problem with the same evaluator (:data:`SAME_PROBLEM`)."""
    if (a.scenario, a.evaluator) != (b.scenario, b.evaluator):
        return False
    return all(a.settings.get(k) == b.settings.get(k) for k in SAME_PROBLEM)


def targets_of(exp: Experiment) -> Targets:
    """The targets the experiment searched under (its recorded settings)."""
    s = exp.settings
    try:
        return Targets(float(s["quality_floor"]), float(s["p95_cap_s"]), float(s["budget_per_hour"]))
    except (KeyError, TypeError, ValueError):
        raise BouteError(
            f"report: experiment '{exp.name}' records no targets (quality floor, P95 cap, budget)"
        ) from None


def build_report(
    exp: Experiment,
    rows: Sequence[StoredTrial],
    others: Sequence[tuple[Experiment, Sequence[StoredTrial]]],
    plan: tuple[Mapping[str, Any], int | None, str | None] | None,
    verdict: Mapping[str, Any] | None,
) -> Report:
    """The report (module doc) from the experiment, its trial rows, the same problem's other experiments with
    theirs, its latest plan (document, trial index, path) and a verdict."""
    targets = targets_of(exp)
    objective = Objective.from_label(exp.settings.get("objective"))
    progress = PROGRESS[objective.name]
    trials = [trial_from_row(r) for r in rows]
    searched = [t for t in trials if t.status not in CONFIRMING]
    points = tuple(_point(t, targets) for t in searched if t.ok)
    front = tuple(_point(t, targets) for t in pareto_front(searched, Objective("pareto"), targets))
    curves = [curve(exp, rows, targets, progress, this=True)]
    curves += [curve(e, r, targets, progress, this=False) for e, r in others]
    notes: list[str] = []
    if not curves[0].timed:
        notes.append("wall time per trial was not recorded for this experiment (tracked before BOute kept it)")
    chosen = None
    if plan is not None:
        chosen, note = chosen_plan(*plan)
        if note:
            notes.append(note)
    wall = exp.settings.get("wall_s")
    return Report(
        experiment=experiment_info(exp),
        targets=targets,
        points=points,
        front=front,
        screened=sum(t.status == TrialStatus.SCREENED for t in trials),
        failed=sum(t.status == TrialStatus.FAILED for t in trials),
        confirmations=sum(t.status in CONFIRMING for t in trials),
        progress=progress,
        curves=tuple(curves),
        phases=phases(exp.settings.get("phase_s") or {}),
        wall_s=float(wall) if isinstance(wall, int | float) else None,
        plan=chosen,
        verification=verification(verdict) if verdict is not None else None,
        notes=tuple(notes),
    )


def experiment_info(exp: Experiment) -> ExperimentInfo:
    created = getattr(exp, "created_at", None)
    return ExperimentInfo(
        id=exp.id,
        name=exp.name,
        scenario=exp.scenario,
        strategy=exp.strategy,
        evaluator=exp.evaluator,
        seed=exp.seed,
        status=exp.status,
        created_at=created.isoformat(timespec="seconds") if created is not None else None,
        objective=Objective.from_label(exp.settings.get("objective")).label,
        mode=exp.settings.get("mode"),
    )


def _point(t: Trial, targets: Targets) -> Point:
    r = t.checked_result
    ok = targets.met_by(r.quality, r.p95_latency_s, r.cost_per_hour, r.quality_se)
    return Point(t.index, r.quality, r.p95_latency_s, r.cost_per_hour, ok)


def curve(exp: Experiment, rows: Sequence[StoredTrial], targets: Targets, progress: Progress, *, this: bool) -> Curve:
    """The experiment's best feasible plan after each of its search evaluations (:class:`Curve`), on
    ``progress``'s figure. Screened proposals cost no evaluation and confirmations are not the search's:
    neither is a step."""
    evals: list[int] = []
    elapsed: list[float | None] = []
    best: list[float | None] = []
    feasible: list[tuple[float, float, float]] = []  # (quality, P95, $/h) of the feasible plans so far
    current: float | None = None
    for row in sorted(rows, key=lambda r: r.index):
        t = trial_from_row(row)
        if t.status in CONFIRMING or not t.evaluated:
            continue
        r = t.result
        if t.ok and r is not None and targets.met_by(r.quality, r.p95_latency_s, r.cost_per_hour, r.quality_se):
            feasible.append((r.quality, r.p95_latency_s, r.cost_per_hour))
            current = _best(feasible, current, progress, targets)
        evals.append(len(evals) + 1)
        elapsed.append(row.elapsed_s)
        best.append(current)
    return Curve(exp.name, exp.strategy, exp.seed, tuple(evals), tuple(elapsed), tuple(best), this)


def _best(
    feasible: list[tuple[float, float, float]], current: float | None, progress: Progress, targets: Targets
) -> float:
    """The progress figure once the latest feasible plan (``feasible[-1]``) joined the others."""
    q, p, c = feasible[-1]
    if progress.figure == "p95":
        return p if current is None else min(current, p)
    if progress.figure == "cost":
        return c if current is None else min(current, c)
    import numpy as np

    from boute.optimize.trials import hypervolume3

    qs, ps, cs = (np.array(col, dtype=float) for col in zip(*feasible, strict=True))
    return hypervolume3(qs, ps, cs, targets)


def phases(seconds: Mapping[str, float]) -> tuple[Phase, ...]:
    """The recorded phases in the clock's order, each with its sub-phases (``propose.fit`` -> ``fit``)."""
    out = []
    for name, total in top_level(seconds).items():
        parts = tuple((k.split(".", 1)[1], float(v)) for k, v in seconds.items() if k.startswith(name + "."))
        out.append(Phase(name, float(total), parts))
    return tuple(sorted(out, key=lambda p: PHASES.index(p.name) if p.name in PHASES else len(PHASES)))


def chosen_plan(doc: Mapping[str, Any], trial: int | None, path: str | None) -> tuple[ChosenPlan | None, str | None]:
    """The plan as the report draws it, and a note when it cannot be drawn or its prices are the packaged
    catalog's (a plan recorded before plans were recorded with their scenario)."""
    from pydantic import ValidationError

    from boute.specs import Plan

    try:
        plan = Plan.model_validate(dict(doc))
    except ValidationError as exc:
        return None, f"the recorded plan does not read as a plan: {str(exc).splitlines()[0]}"
    prices, source, note = gpu_prices(plan)
    r, pred = plan.routing, plan.predicted
    shares = r.fractions if r.fractions is not None else (pred.tier_shares if pred is not None else None)
    tiers = []
    for i, name in enumerate(r.tiers):
        groups = tuple(
            GroupBox(j, g.tier, g.model, g.gpu, g.count, g.tp, g.pp, g.dtype, prices.get(g.gpu, float("nan")))
            for j, g in enumerate(plan.deployment)
            if g.tier == name
        )
        tiers.append(TierBox(name, None if shares is None else float(shares[i]), groups))
    chosen = ChosenPlan(
        trial=trial,
        path=path,
        objective=plan.objective,
        evaluator=pred.evaluator if pred else None,
        quality=pred.quality if pred else None,
        quality_bound=pred.quality_bound if pred else None,
        p95_s=pred.p95_latency_s if pred else None,
        p50_s=pred.p50_latency_s if pred else None,
        throughput_rps=pred.throughput_rps if pred else None,
        cost_per_hour=pred.cost_per_hour if pred else None,
        feasible=pred.feasible if pred else None,
        mode=r.mode,
        tiers=tuple(tiers),
        prices_from=source,
    )
    return chosen, note


def gpu_prices(plan: Any) -> tuple[dict[str, float], str, str | None]:
    """$/GPU-hour of each GPU type the plan uses, where they came from, and a note when that is not the
    plan's own scenario: the scenario's ``cluster.prices`` overrides, else its catalog's (packaged entries
    plus the scenario's own, :func:`boute.serving.bundle.plan_catalog`)."""
    from boute.serving.bundle import plan_catalog

    spec = plan.scenario_spec or {}
    overrides = (spec.get("cluster") or {}).get("prices") or {}
    catalog = plan_catalog(plan)
    out: dict[str, float] = {}
    for g in plan.deployment:
        if g.gpu in overrides:
            out[g.gpu] = float(overrides[g.gpu])
        elif g.gpu in catalog.gpus:
            out[g.gpu] = float(catalog.gpu(g.gpu).price_per_hour)
    if spec:
        return out, "the plan's scenario", None
    return (
        out,
        "the packaged GPU catalog",
        "the plan was recorded without its scenario: GPU prices are the packaged catalog's",
    )


def verification(doc: Mapping[str, Any]) -> Verification:
    """A verdict (``Verdict.to_dict`` with the replay's info) as the report shows it."""
    m = doc.get("measured") or {}
    checks = tuple(
        CheckRow(
            str(c["name"]),
            _num(c.get("promised")),
            _num(c.get("measured")),
            str(c.get("tolerance", "")),
            bool(c.get("ok")),
        )
        for c in doc.get("checks") or []
    )
    return Verification(
        ok=bool(doc.get("ok")),
        checks=checks,
        requests=int(m.get("requests") or 0),
        failed=int(m.get("failed") or 0),
        p50_s=_num(m.get("p50_s")),
        p95_s=_num(m.get("p95_s")),
        rate_rps=_num(doc.get("rate_rps")),
        duration_s=_num(doc.get("duration_s")),
        gateway=doc.get("gateway"),
        notes=tuple(str(n) for n in doc.get("notes") or ()),
        at=doc.get("at"),
    )


def _num(v: Any) -> float | None:
    return None if v is None else float(v)
