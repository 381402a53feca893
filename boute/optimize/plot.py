"""Front plots (PNG, matplotlib Agg): every evaluated plan, the front, the targets, the plan written.

``latency``: quality against P95, the (quality, P95) front. ``cost`` and ``pareto``: the 3-D front of
quality x P95 x $/h, drawn as its three pairwise projections side by side (a 3-D scatter hides depth on
paper): each panel shows every evaluated plan in grey, the front points coloured by the third axis, the
targets as dashed lines and the written plan as a star, so every front point can be read off two panels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boute.optimize.evaluators.base import EvalResult
    from boute.optimize.outcome import Outcome

#: the three axes of the front, by the result field they plot
AXES: dict[str, Callable[[EvalResult], float]] = {
    "quality": lambda r: r.quality,
    "p95_latency_s": lambda r: r.p95_latency_s,
    "cost_per_hour": lambda r: r.cost_per_hour,
}


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(p)
    return p


def _written(out: Outcome) -> EvalResult | None:
    """The written plan's figures (the confirming evaluator's when confirmed), or None."""
    t = out.final
    if t is None or t.result is None:
        return None
    return out.confirmed.get(t.index, t.result)


def plot_front(out: Outcome, path: str | Path) -> Path:
    """The front plot of ``out`` written to ``path`` (module doc); the 3-D projections for cost and pareto."""
    import matplotlib

    matplotlib.use("Agg")
    if out.objective.name != "latency":
        return plot_front3(out, path)
    import matplotlib.pyplot as plt

    tg = out.space.scenario.goal
    ok = [t for t in out.trials if t.ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    ax.scatter(
        [t.checked_result.quality for t in ok],
        [t.checked_result.p95_latency_s for t in ok],
        s=12,
        c="0.7",
        label="evaluated",
    )
    fr = out.front
    ax.plot(
        [t.checked_result.quality for t in fr],
        [t.checked_result.p95_latency_s for t in fr],
        "o-",
        c="tab:blue",
        ms=4,
        label="Pareto front",
    )
    ax.axvline(tg.quality_floor, ls="--", c="tab:red", lw=1, label="quality floor")
    ax.axhline(tg.p95_cap_s, ls=":", c="tab:red", lw=1, label="P95 cap")
    r = _written(out)
    if r is not None:
        ax.scatter([r.quality], [r.p95_latency_s], marker="*", s=160, c="tab:orange", zorder=5, label="chosen")
    ax.set_yscale("log")
    ax.set_xlabel("quality (profile scale)")
    ax.set_ylabel("P95 latency, s (log)")
    ax.set_title(f"{out.space.scenario.name}: {out.evaluations} evaluations (approximate perf model)")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return _save(fig, path)


#: per axis of the 3-D front: its label, its target, the target's name, whether it is drawn on a log scale
AxisStyle = tuple[str, float, str, bool]

#: the three pairwise projections: (x axis, y axis, the axis the front points are coloured by)
PANELS = (
    ("cost_per_hour", "p95_latency_s", "quality"),
    ("cost_per_hour", "quality", "p95_latency_s"),
    ("quality", "p95_latency_s", "cost_per_hour"),
)


def plot_front3(out: Outcome, path: str | Path) -> Path:
    """The quality x P95 x $/h front as three pairwise projections (module doc)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tg = out.space.scenario.goal
    styles: dict[str, AxisStyle] = {
        "quality": ("quality (profile scale)", tg.quality_floor, "quality floor", False),
        "p95_latency_s": ("P95 latency, s (log)", tg.p95_cap_s, "P95 cap", True),
        "cost_per_hour": ("cost, $/h", tg.budget, "budget", False),
    }
    fig, axs = plt.subplots(1, 3, figsize=(15.0, 4.6), dpi=100)
    for ax, panel in zip(axs, PANELS, strict=True):
        _front_panel(fig, ax, out, panel, styles)
    axs[0].legend(fontsize=7, loc="upper right")
    n_scr = out.screened
    fig.suptitle(
        f"{out.space.scenario.name}: objective {out.objective.label}, {out.evaluations} evaluations"
        + (f" ({n_scr} screened out)" if n_scr else "")
        + "; front = plans meeting all targets, none better on all three (approximate perf model)",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, path)


def _front_panel(fig: Any, ax: Any, out: Outcome, panel: tuple[str, str, str], styles: dict[str, AxisStyle]) -> None:
    """One projection: every evaluated plan in grey, the front coloured by the third axis, the targets
    dashed, the written plan starred (and ringed where the search put it, when the confirmation moved it)."""
    import numpy as np

    xk, yk, ck = panel
    ok = [t for t in out.trials if t.ok]
    fr = out.front
    xs = np.array([AXES[xk](t.checked_result) for t in ok])
    ys = np.array([AXES[yk](t.checked_result) for t in ok])
    ax.scatter(xs, ys, s=9, c="0.8", label=f"evaluated ({len(ok)})", zorder=1)
    if fr:
        cv = np.array([AXES[ck](t.checked_result) for t in fr])
        sc = ax.scatter(
            [AXES[xk](t.checked_result) for t in fr],
            [AXES[yk](t.checked_result) for t in fr],
            s=42,
            c=cv,
            cmap="viridis",
            edgecolors="k",
            linewidths=0.5,
            label=f"3-D front ({len(fr)})",
            zorder=3,
        )
        cb = fig.colorbar(sc, ax=ax, pad=0.02)
        cb.set_label(styles[ck][0].replace(" (log)", ""), fontsize=8)
    _target_lines(ax, xk, yk, styles)
    _written_marks(ax, out, xk, yk)
    ax.set_xlabel(styles[xk][0].replace(" (log)", ""))
    ax.set_ylabel(styles[yk][0])
    if styles[yk][3]:
        ax.set_yscale("log")
    ax.grid(alpha=0.25)


def _target_lines(ax: Any, xk: str, yk: str, styles: dict[str, AxisStyle]) -> None:
    """The targets of the panel's two axes as dashed lines, each named along its line."""
    for key, line in ((xk, ax.axvline), (yk, ax.axhline)):
        _, v, name, _ = styles[key]
        line(v, ls="--", c="tab:red", lw=1)
        ax.annotate(
            name,
            xy=(v, 0.02) if key == xk else (0.01, v),
            xycoords=("data", "axes fraction") if key == xk else ("axes fraction", "data"),
            fontsize=7,
            color="tab:red",
            rotation=90 if key == xk else 0,
            va="bottom",
            ha="right" if key == xk else "left",
        )


#: how the written plan is marked on every front drawn (the optimiser's plot and the report's)
WRITTEN_STAR: dict[str, Any] = {
    "marker": "*",
    "s": 260,
    "c": "tab:orange",
    "edgecolors": "k",
    "linewidths": 0.6,
    "zorder": 5,
}


def _written_marks(ax: Any, out: Outcome, xk: str, yk: str) -> None:
    """The written plan: starred at its written figures, ringed where the search put it when they differ."""
    r = _written(out)
    t = out.final
    if t is not None and t.result is not None and r is not None and t.result is not r:
        ax.scatter(  # where the search put the written plan, when the confirmation moved it
            [AXES[xk](t.checked_result)],
            [AXES[yk](t.checked_result)],
            marker="o",
            s=150,
            facecolors="none",
            edgecolors="tab:orange",
            linewidths=1.5,
            zorder=4,
            label=f"written plan by {t.result.evaluator}",
        )
    if r is not None:
        ax.scatter([AXES[xk](r)], [AXES[yk](r)], label=f"written ({r.evaluator})", **WRITTEN_STAR)
