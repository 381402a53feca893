"""Pareto plot (PNG, matplotlib Agg): every evaluated plan, the front, the targets, the chosen plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_front(out: Any, path: str | Path) -> Path:  # noqa: ANN401 - session.Outcome
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from boute.optimize.loop import targets_of

    tg = targets_of(out.space)
    ok = [t for t in out.trials if t.ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    ax.scatter([t.result.quality for t in ok], [t.result.p95_latency_s for t in ok], s=12, c="0.7", label="evaluated")
    fr = out.front
    ax.plot(
        [t.result.quality for t in fr],
        [t.result.p95_latency_s for t in fr],
        "o-",
        c="tab:blue",
        ms=4,
        label="Pareto front",
    )
    ax.axvline(tg.quality_floor, ls="--", c="tab:red", lw=1, label="quality floor")
    ax.axhline(tg.p95_cap_s, ls=":", c="tab:red", lw=1, label="P95 cap")
    if out.final is not None and out.final.result is not None:
        r = out.final.result
        ax.scatter([r.quality], [r.p95_latency_s], marker="*", s=160, c="tab:orange", zorder=5, label="chosen")
    ax.set_yscale("log")
    ax.set_xlabel("quality (profile scale)")
    ax.set_ylabel("P95 latency, s (log)")
    ax.set_title(f"{out.space.scenario.name}: {len(out.trials)} evaluations (approximate perf model)")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(p)
    return p
