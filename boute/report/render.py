"""A :class:`~boute.report.model.Report` as one self-contained HTML page.

Self-contained: the styles are inline, the charts are SVG ``data:`` URIs and the deployment an inline SVG, so
the page opens from a file, a mail attachment or a CI artifact with no network (it links to nothing and
runs no script). The page (``template.html``, a package file filled by :class:`string.Template`) shows each
figure rounded and keeps its exact value in ``data-value`` beside the name in ``data-figure``, so a test
or a script can read the figures back without parsing the rounding. Every text from the DB is escaped.
"""

from __future__ import annotations

import math
from html import escape
from importlib import resources
from string import Template

from boute.report import figures
from boute.report.diagram import deployment_svg
from boute.report.model import ChosenPlan, Curve, Report, Verification

#: what every number in the page is rounded to, by kind (one place: the test reads the same)
FORMATS = {
    "quality": "{:.4f}",
    "seconds": "{:.3g} s",
    "money": "${:,.2f}/h",
    "rate": "{:.1f} req/s",
    "check": "{:.4g}",
}


def shown(kind: str, value: float | None) -> str:
    """``value`` as the page shows a figure of ``kind`` (:data:`FORMATS`); a missing figure is a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return FORMATS[kind].format(value)


def _figure(label: str, name: str, kind: str, value: float | None) -> str:
    exact = "" if value is None else f' data-value="{value!r}"'
    return f'<div><span>{escape(label)}</span><b data-figure="{name}"{exact}>{escape(shown(kind, value))}</b></div>'


def _table(head: list[str], rows: list[list[str]], num: set[int] | None = None) -> str:
    num = num or set()
    th = "".join(f"<th{' class=num' if i in num else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in num else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _header(r: Report) -> str:
    e, tg = r.experiment, r.targets
    facts = [
        f"scenario <b>{escape(e.scenario)}</b>",
        f"strategy <b>{escape(e.strategy)}</b>",
        f"evaluator <b>{escape(e.evaluator)}</b>",
        f"seed {e.seed}",
        f"objective <b>{escape(e.objective)}</b>",
        f"routing {escape(e.mode or '-')}",
        f"status <b>{escape(e.status)}</b>",
    ]
    if e.created_at:
        facts.append(f"started {escape(e.created_at)}")
    targets = (
        f"targets: quality &ge; {tg.quality_floor:g}, P95 &le; {tg.p95_cap_s:g} s, cost &le; "
        f"{escape(shown('money', tg.budget))}"
    )
    return (
        f"<header><h1>BOute report: {escape(e.name)}</h1><p>{' &middot; '.join(facts)}</p>"
        f'<p data-section="targets">{targets}</p></header>'
    )


def _plan(p: ChosenPlan | None) -> str:
    if p is None:
        return (
            '<section id="plan"><h2>The plan</h2><p class="note">No plan was written by this experiment.</p></section>'
        )
    verdict = "-" if p.feasible is None else ("meets the targets" if p.feasible else "misses a target")
    figs = "".join(
        [
            _figure("quality", "quality", "quality", p.quality),
            _figure("quality, lower bound", "quality_bound", "quality", p.quality_bound),
            _figure("P95 latency", "p95_latency_s", "seconds", p.p95_s),
            _figure("P50 latency", "p50_latency_s", "seconds", p.p50_s),
            _figure("throughput", "throughput_rps", "rate", p.throughput_rps),
            _figure("cost", "cost_per_hour", "money", p.cost_per_hour),
        ]
    )
    rows = [
        [
            escape(g.tier),
            escape(g.model),
            escape(g.gpu),
            f'<span data-figure="count" data-group="{g.index}" data-value="{g.count}">{g.count}</span>',
            f"{g.tp}",
            f"{g.pp}",
            f"{g.gpus}",
            escape(shown("money", g.price_per_gpu_hour)),
            f'<span data-figure="cost" data-group="{g.index}" data-value="{g.cost_per_hour!r}">'
            f"{escape(shown('money', g.cost_per_hour))}</span>",
        ]
        for g in p.groups
    ]
    table = _table(
        ["tier", "model", "GPU", "replicas", "TP", "PP", "GPUs", "$/GPU-hour", "$/h"], rows, num={3, 4, 5, 6, 7, 8}
    )
    origin = f"trial {p.trial}" if p.trial is not None else "the search"
    where = f" written to <code>{escape(p.path)}</code>" if p.path else ""
    return (
        f'<section id="plan"><h2>The plan</h2><p>Chosen by <b>{escape(p.objective or "latency")}</b> from {origin}{where}; '
        f"figures by the <b>{escape(p.evaluator or '-')}</b> evaluator ({verdict}).</p>"
        f'<div class="figures">{figs}</div>{deployment_svg(p)}{table}'
        f'<p class="note">GPU prices from {escape(p.prices_from)}; a group costs replicas x TP x PP x its GPU\'s $/h.</p>'
        "</section>"
    )


def _bar(value: float | None, cls: str = "") -> str:
    if value is None or not 0 <= value <= 1:
        return ""
    return f'<span class="bar {cls}" style="width:{120 * value:.1f}px"></span>'


def _verification(v: Verification | None) -> str:
    if v is None:
        return (
            '<section id="verify"><h2>Promised vs measured</h2><p class="note">Not verified yet: '
            "<code>boute verify --plan PLAN --db DB</code> replays the plan's own traffic and records the verdict "
            "here.</p></section>"
        )
    rows = []
    for c in v.checks:
        share = c.name.startswith("share ")
        promised = escape(shown("check", c.promised)) + (_bar(c.promised) if share else "")
        measured = escape(shown("check", c.measured)) + (_bar(c.measured, "measured") if share else "")
        attrs = f' data-check="{escape(c.name)}" data-promised="{c.promised!r}" data-measured="{c.measured!r}"'
        rows.append(
            [
                f"<span{attrs}>{escape(c.name)}</span>",
                promised,
                measured,
                escape(c.tolerance),
                '<span class="ok">yes</span>' if c.ok else '<span class="no">NO</span>',
            ]
        )
    head = "verified: the plan serves as promised" if v.ok else "NOT verified: see the checks marked NO"
    how = f"{v.requests} requests ({v.failed} failed)"
    if v.rate_rps is not None and v.duration_s is not None:
        how += f" at {v.rate_rps:g} req/s over {v.duration_s:g} s"
    if v.gateway:
        how += f" through {escape(v.gateway)}"
    if v.at:
        how += f", {escape(v.at)}"
    notes = "".join(f'<p class="note">note: {escape(n)}</p>' for n in v.notes)
    return (
        f'<section id="verify"><h2>Promised vs measured</h2>'
        f'<p class="{"ok" if v.ok else "no"}" data-verdict="{"ok" if v.ok else "failed"}">{head}</p>'
        f"<p>{how}; measured P50 {escape(shown('seconds', v.p50_s))}, P95 {escape(shown('seconds', v.p95_s))}.</p>"
        f"{_table(['check', 'promised', 'measured', 'tolerance', 'ok'], rows, num={1, 2})}{notes}</section>"
    )


def _front(r: Report) -> str:
    counts = (
        f"{len(r.points)} plans evaluated by the search, {sum(p.feasible for p in r.points)} of them meeting the "
        f"targets, {len(r.front)} on their front; {r.screened} proposals screened out before evaluation, "
        f"{r.failed} evaluations failed, {r.confirmations} confirming evaluations."
    )
    if not r.points:
        return f'<section id="front"><h2>Pareto front</h2><p class="note">{counts}</p></section>'
    rows = [
        [
            str(p.index),
            escape(shown("quality", p.quality)),
            escape(shown("seconds", p.p95_s)),
            escape(shown("money", p.cost_per_hour)),
        ]
        for p in r.front
    ]
    return (
        '<section id="front"><h2>Pareto front: quality x P95 x $/h</h2>'
        f"<p>{counts} Each panel is one pairwise projection of the three-way front; the star is the written "
        "plan at its confirmed figures.</p>"
        f'<img class="chart" alt="Pareto front projections" src="{figures.front_figure(r)}">'
        f"<details><summary>front points ({len(r.front)})</summary>"
        f"{_table(['trial', 'quality', 'P95', '$/h'], rows, num={0, 1, 2, 3})}</details></section>"
    )


def _best_at_end(c: Curve) -> float | None:
    return c.best[-1] if c.best else None


def _progress(r: Report) -> str:
    fmt = {"p95": "seconds", "cost": "money", "hypervolume": "check"}[r.progress.figure]
    rows = []
    for c in r.curves:
        last = _best_at_end(c)
        first = next((i for i, b in enumerate(c.best) if b is not None and b == last), None)
        when = "-" if first is None else f"{c.evaluations[first]}"
        secs = c.elapsed_s[first] if first is not None else None
        rows.append(
            [
                ("<b>" + escape(c.experiment) + "</b>") if c.this else escape(c.experiment),
                escape(c.strategy),
                str(c.seed),
                str(len(c.evaluations)),
                escape(shown(fmt, last)),
                when,
                escape(shown("seconds", secs)),
            ]
        )
    table = _table(
        ["experiment", "strategy", "seed", "evaluations", "best", "reached at evaluation", "reached at"],
        rows,
        num={2, 3, 4, 5, 6},
    )
    others = len(r.curves) - 1
    intro = (
        f"The best feasible plan so far ({escape(r.progress.label)}), against evaluations and against the run's "
        "wall time"
        + (
            f", beside {others} other experiment{'s' if others > 1 else ''} of the same problem (scenario, targets, "
            "objective, routing mode, perf model, evaluator)."
            if others
            else ". No other experiment of the same problem is recorded: run one with another --strategy to compare."
        )
    )
    return (
        f'<section id="progress"><h2>Best feasible plan over the search</h2><p>{intro}</p>'
        f'<img class="chart" alt="best feasible plan against evaluations and wall time" '
        f'src="{figures.progress_figure(r)}">{table}</section>'
    )


def _phases(r: Report) -> str:
    if not r.phases:
        return '<section id="time"><h2>Where the time went</h2><p class="note">No phases recorded.</p></section>'
    total = sum(p.seconds for p in r.phases)
    rows = []
    for p in r.phases:
        inner = ", ".join(f"{escape(n)} {s:.1f} s" for n, s in p.parts)
        rows.append(
            [
                escape(p.name),
                f'<span data-phase="{escape(p.name)}" data-value="{p.seconds!r}">{p.seconds:.1f} s</span>',
                inner,
            ]
        )
    wall = ""
    if r.wall_s is not None:
        wall = (
            f" of a {r.wall_s:.1f} s run ({max(0.0, r.wall_s - total):.1f} s outside them: loading, writing the plan)"
        )
    return (
        f'<section id="time"><h2>Where the time went</h2><p>{total:.1f} s in the phases{wall}.</p>'
        f'<img class="chart" alt="time by phase" src="{figures.phases_figure(r.phases, r.wall_s)}">'
        f"{_table(['phase', 'seconds', 'of which'], rows, num={1})}</section>"
    )


def render(report: Report) -> str:
    """The page (module doc)."""
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in report.notes)
    body = "".join(
        [
            _header(report),
            _plan(report.plan),
            _verification(report.verification),
            _front(report),
            _progress(report),
            _phases(report),
            f'<section id="notes"><h2>Notes</h2>{notes}<p class="note">Latency and throughput are the evaluators\' '
            "figures: the simulator and the fast path stand on an analytical performance model calibrated to "
            "published measurements (approximate; docs/perf-model.md). Quality is the profile's held-out mean.</p></section>",
        ]
    )
    template = Template(resources.files("boute.report").joinpath("template.html").read_text(encoding="utf-8"))
    return template.substitute(
        title=escape(f"BOute report: {report.experiment.name}"),
        body=body,
        footer=f"boute report of experiment {report.experiment.id} ({escape(report.experiment.name)})",
    )
