"""The chosen plan's deployment as an inline SVG: requests -> tiers -> replica groups.

Each tier shows its model and the share of requests it is sent (pre-route) or answers (cascade); each of its
replica groups shows the GPU type, the replica count, TP x PP and what the group costs an hour (replicas x
TP x PP x the GPU's $/h), and draws its replicas, each as a block of ``pp`` rows of ``tp`` GPUs. Written by
hand rather than by matplotlib so that its figures are text in the page: ``data-figure`` attributes name
them (the browser test reads them back).
"""

from __future__ import annotations

from html import escape

from boute.report.model import ChosenPlan, GroupBox, TierBox

#: replicas drawn per group; more are counted, not drawn
MAX_DRAWN = 16
CELL = 9  # one GPU's square, px
WIDTH = 980
ROW_MIN = 74  # a group's row height at least, px


def _text(
    x: float, y: float, body: str, *, size: int = 12, weight: str = "normal", anchor: str = "start", **data: str
) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{escape(v)}"' for k, v in data.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" text-anchor="{anchor}"{attrs}>'
        f"{escape(body)}</text>"
    )


def _replicas(g: GroupBox, x0: float, y0: float) -> tuple[list[str], float]:
    """The group's replicas as GPU blocks from (x0, y0); returns the SVG parts and the height used."""
    parts: list[str] = []
    w, h = g.tp * CELL + 4, g.pp * CELL + 4
    per_row = max(1, int((WIDTH - x0 - 10) // (w + 6)))
    drawn = min(g.count, MAX_DRAWN)
    for k in range(drawn):
        x, y = x0 + (k % per_row) * (w + 6), y0 + (k // per_row) * (h + 6)
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="2" class="replica"/>')
        for r in range(g.pp):
            for c in range(g.tp):
                parts.append(
                    f'<rect x="{x + 2 + c * CELL:.1f}" y="{y + 2 + r * CELL:.1f}" width="{CELL - 1}" '
                    f'height="{CELL - 1}" class="gpu"/>'
                )
    rows = (drawn + per_row - 1) // per_row
    used = rows * (h + 6)
    if g.count > drawn:
        parts.append(_text(x0, y0 + used + 10, f"+{g.count - drawn} more replicas", size=10))
        used += 14
    return parts, used


def _money(v: float) -> str:
    return f"${v:,.2f}/h"


TIER_X, GROUP_X = 170.0, 420.0


def _group_box(g: GroupBox, y: float) -> tuple[list[str], float]:
    """One replica group's box at height ``y``: GPU type and count, parallelism, $/h and its replicas; and
    the height it takes."""
    blocks, used = _replicas(g, GROUP_X + 10, y + 48)
    height = max(ROW_MIN, 48 + used + 8)
    gi = str(g.index)
    parts = [
        f'<rect x="{GROUP_X}" y="{y:.1f}" width="{WIDTH - GROUP_X - 6}" height="{height - 8:.1f}" rx="6" class="group"/>',
        _text(
            GROUP_X + 10, y + 18, f"{g.count} x {g.gpu}", weight="bold", figure="replicas", group=gi, value=str(g.count)
        ),
        _text(
            GROUP_X + 10,
            y + 36,
            f"TP {g.tp} x PP {g.pp}, {g.tp * g.pp} GPUs per replica, {g.gpus} GPUs, {g.dtype}",
            size=11,
            figure="parallelism",
            group=gi,
            tp=str(g.tp),
            pp=str(g.pp),
        ),
        _text(
            WIDTH - 16,
            y + 18,
            _money(g.cost_per_hour),
            weight="bold",
            anchor="end",
            figure="group-cost",
            group=gi,
            value=repr(g.cost_per_hour),
        ),
    ]
    return parts + blocks, height


def _tier_box(tier: TierBox, mode: str, top: float, height: float, entry_y: float) -> list[str]:
    """A tier's box beside its groups (``top``, ``height``), with the edges from the entry and to its groups."""
    mid = top + height / 2
    model = tier.groups[0].model if tier.groups else ""
    parts = [
        f'<rect x="{TIER_X}" y="{mid - 30:.1f}" width="200" height="60" rx="8" class="tier"/>',
        _text(TIER_X + 100, mid - 10, tier.name, weight="bold", anchor="middle", figure="tier"),
        _text(TIER_X + 100, mid + 6, model, size=11, anchor="middle"),
    ]
    if tier.share is not None:
        verb = "answers" if mode == "cascade" else "sent"
        parts.append(
            _text(
                TIER_X + 100,
                mid + 22,
                f"{verb} {tier.share:.1%}",
                size=11,
                anchor="middle",
                figure="share",
                tier=tier.name,
                value=repr(tier.share),
            )
        )
    parts.append(f'<path d="M 130 {entry_y:.1f} C 150 {entry_y:.1f}, 150 {mid:.1f}, {TIER_X} {mid:.1f}" class="edge"/>')
    parts.append(f'<path d="M {TIER_X + 200} {mid:.1f} L {GROUP_X} {top + 20:.1f}" class="edge"/>')
    return parts


def deployment_svg(plan: ChosenPlan) -> str:
    """The SVG element (module doc): the groups stacked tier by tier, then each tier's box beside its groups,
    the entry box, and the deployment's $/h."""
    parts: list[str] = []
    y = 30.0
    rows: list[tuple[float, float]] = []  # (top, height) of each tier's block
    for tier in plan.tiers:
        top = y
        for g in tier.groups:
            box, height = _group_box(g, y)
            parts += box
            y += height
        if not tier.groups:
            parts.append(_text(GROUP_X + 10, y + 24, "no replicas (sent nothing)", size=11))
            y += 40
        rows.append((top, y - top - 8))
        y += 10
    for tier, (top, height) in zip(plan.tiers, rows, strict=True):
        parts += _tier_box(tier, plan.mode, top, height, y / 2)
    entry = "requests -> router" if plan.mode == "preroute" else "requests -> cascade"
    parts.append(f'<rect x="6" y="{y / 2 - 22:.1f}" width="124" height="44" rx="8" class="entry"/>')
    parts.append(_text(68, y / 2 + 4, entry, size=11, anchor="middle"))
    total = _text(
        WIDTH - 16,
        16,
        f"deployment {_money(plan.deployment_cost)}",
        weight="bold",
        anchor="end",
        figure="deployment-cost",
        value=repr(plan.deployment_cost),
    )
    height = max(y + 10, 120)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="deployment" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" role="img" aria-label="deployment">{total}{"".join(parts)}</svg>'
    )
