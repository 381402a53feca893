"""The report's charts, drawn with matplotlib (Agg) as SVG and returned as ``data:`` URIs: the page fetches
nothing to show them, and each chart's ids stay inside its own image.

* :func:`front_figure`: the quality x P95 x $/h front as its three pairwise projections (the panels of
  :data:`boute.optimize.plot.PANELS`): every evaluated plan in grey, the feasible front coloured by the
  third axis, the targets dashed, the written plan starred at its confirmed figures.
* :func:`progress_figure`: the best feasible plan so far against evaluations and against wall time, one
  line per experiment of the same problem, coloured by strategy, the report's own drawn thicker.
* :func:`phases_figure`: where the run's time went, one bar per phase, its sub-phases stacked inside.

The SVG is made reproducible (fixed hash salt, no date) so the same report renders to the same bytes.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

from boute.optimize.plot import WRITTEN_STAR
from boute.report.model import Curve, Phase, Point, Report

#: one colour per strategy, in the order they first appear
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "boute-report"
    plt.rcParams["svg.fonttype"] = "path"  # glyphs as paths: no font is looked up where the page is viewed
    return plt


def _uri(fig: Any) -> str:
    """The figure as an SVG ``data:`` URI (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _axis(key: str, report: Report) -> tuple[str, float, str, bool]:
    """(label, target, target's name, log scale) of one front axis."""
    tg = report.targets
    return {
        "quality": ("quality (profile scale)", tg.quality_floor, "quality floor", False),
        "p95_latency_s": ("P95 latency, s (log)", tg.p95_cap_s, "P95 cap", True),
        "cost_per_hour": ("cost, $/h", tg.budget, "budget", False),
    }[key]


def _value(p: Point, key: str) -> float:
    return {"quality": p.quality, "p95_latency_s": p.p95_s, "cost_per_hour": p.cost_per_hour}[key]


def front_figure(report: Report) -> str:
    """The front's three projections (module doc) as a data URI."""
    from boute.optimize.plot import PANELS

    plt = _plt()
    fig, axs = plt.subplots(1, 3, figsize=(15.0, 4.4), dpi=100)
    for ax, (xk, yk, ck) in zip(axs, PANELS, strict=True):
        _front_panel(fig, ax, report, xk, yk, ck)
    axs[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return _uri(fig)


def _front_panel(fig: Any, ax: Any, report: Report, xk: str, yk: str, ck: str) -> None:
    pts, front = report.points, report.front
    ax.scatter(
        [_value(p, xk) for p in pts], [_value(p, yk) for p in pts], s=9, c="0.8", label=f"evaluated ({len(pts)})"
    )
    if front:
        sc = ax.scatter(
            [_value(p, xk) for p in front],
            [_value(p, yk) for p in front],
            s=42,
            c=[_value(p, ck) for p in front],
            cmap="viridis",
            edgecolors="k",
            linewidths=0.5,
            label=f"feasible front ({len(front)})",
            zorder=3,
        )
        fig.colorbar(sc, ax=ax, pad=0.02).set_label(_axis(ck, report)[0].replace(" (log)", ""), fontsize=8)
    for key, line in ((xk, ax.axvline), (yk, ax.axhline)):
        line(_axis(key, report)[1], ls="--", c="tab:red", lw=1)
    plan = report.plan
    if plan is not None and None not in (plan.quality, plan.p95_s, plan.cost_per_hour):
        star = {"quality": plan.quality, "p95_latency_s": plan.p95_s, "cost_per_hour": plan.cost_per_hour}
        ax.scatter([star[xk]], [star[yk]], label=f"written plan ({plan.evaluator})", **WRITTEN_STAR)
    ax.set_xlabel(_axis(xk, report)[0].replace(" (log)", ""))
    ax.set_ylabel(_axis(yk, report)[0])
    if _axis(yk, report)[3]:
        ax.set_yscale("log")
    ax.grid(alpha=0.25)


def _colours(curves: tuple[Curve, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in curves:
        out.setdefault(c.strategy, PALETTE[len(out) % len(PALETTE)])
    return out


def progress_figure(report: Report) -> str:
    """Best feasible so far against evaluations and wall time (module doc) as a data URI."""
    plt = _plt()
    fig, (by_n, by_t) = plt.subplots(1, 2, figsize=(12.0, 4.0), dpi=100)
    colours = _colours(report.curves)
    shown: set[str] = set()
    for c in sorted(report.curves, key=lambda c: c.this):  # the report's own last: on top
        label = c.strategy if c.strategy not in shown else None
        shown.add(c.strategy)
        style = {"color": colours[c.strategy], "lw": 2.4 if c.this else 1.0, "alpha": 1.0 if c.this else 0.7}
        ys = [math.nan if b is None else b for b in c.best]
        by_n.step(c.evaluations, ys, where="post", label=label, **style)
        if c.timed:
            by_t.step([e or 0.0 for e in c.elapsed_s], ys, where="post", **style)
    for ax, xlabel in ((by_n, "evaluations"), (by_t, "wall time of the run, s")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(report.progress.label)
        if report.progress.log_scale:
            ax.set_yscale("log")
        ax.grid(alpha=0.25)
    if not any(c.timed for c in report.curves):
        by_t.text(0.5, 0.5, "wall time per trial not recorded", ha="center", va="center", transform=by_t.transAxes)
    by_n.legend(fontsize=8, title="strategy", title_fontsize=8)
    fig.tight_layout()
    return _uri(fig)


def phases_figure(phases: tuple[Phase, ...], wall_s: float | None) -> str:
    """One horizontal bar per phase, sub-phases stacked inside it; ``other``: the run's wall time outside
    every phase (writing the plan, imports), when the wall time was recorded."""
    plt = _plt()
    rows: list[tuple[str, float, tuple[tuple[str, float], ...]]] = [(p.name, p.seconds, p.parts) for p in phases]
    if wall_s is not None:
        rest = wall_s - sum(p.seconds for p in phases)
        if rest > 0:
            rows.append(("other", rest, ()))
    fig, ax = plt.subplots(figsize=(9.0, 0.32 * len(rows) + 0.9), dpi=100)
    total = sum(r[1] for r in rows) or 1.0
    for i, (_, seconds, parts) in enumerate(reversed(rows)):
        ax.barh(i, seconds, color="0.75", edgecolor="0.4")
        left = 0.0
        for j, (sub, s) in enumerate(parts):
            ax.barh(i, s, left=left, height=0.5, color=PALETTE[j % len(PALETTE)], alpha=0.8)
            if s / total > 0.06:
                ax.text(left + s / 2, i, sub, ha="center", va="center", fontsize=7, color="white")
            left += s
        ax.text(seconds, i, f"  {seconds:.1f} s ({seconds / total:.0%})", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax.set_xlabel("seconds")
    ax.set_xlim(0, max(r[1] for r in rows) * 1.25 if rows else 1)
    ax.grid(axis="x", alpha=0.25)
    fig.tight_layout()
    return _uri(fig)
