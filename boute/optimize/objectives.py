"""What ``boute optimize`` optimises, and which evaluated plan is the answer: ``latency``, ``cost``, ``pareto``.

Every objective keeps the one feasibility rule (:class:`boute.specs.Targets`, the scenario's ``goal``): only
plans meeting the quality floor, the P95 cap and the budget can be the answer. The objective says which of
them is:

* ``latency`` (default, the paper's method): the lowest P95; ties go to higher quality, then lower $/h.
* ``cost``: the lowest $/h; ties go to lower P95, then higher quality. This answers "what is the cheapest
  deployment that meets my floor and SLO at my traffic?": the budget is only an upper limit.
* ``pareto``: the plans non-dominated in (quality max, P95 min, $/h min) among those meeting the targets; the
  answer is picked from that front by a stated rule, ``prefer`` (:data:`PREFERENCES`):
  ``knee`` (default) the compromise point, ``cost``, ``latency`` or ``quality`` the best on that axis.

The ``knee`` rule scales each axis between its target (0: the floor, the cap, the budget) and the best value
on the feasible front (1), with P95 on a log scale (a cap is a ratio target), and takes the front point
nearest (Euclidean) to the ideal (1, 1, 1). It never picks a dominated plan, and it is invariant to units.

The names, their help and the tie-breaks are written here once (:data:`OBJECTIVES`, :data:`PREFERENCES`,
:data:`TIE_BREAKS`): the CLI, the progress bar and the experiments' baselines read them from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from boute.errors import BouteError
from boute.optimize.registry import Choices

if TYPE_CHECKING:  # annotations only: the CLI reads the names and help here, without the specs' import
    from boute.specs.targets import Targets

#: ``rule(q, p, c, targets) -> index`` over the feasible front (arrays of equal length >= 1)
PreferRule = Callable[[np.ndarray, np.ndarray, np.ndarray, "Targets"], int]

#: the rules that take the best plan on one axis: the figures compared in turn, the first most significant,
#: ``-quality`` meaning higher quality first (``latency``: the lowest P95, ties to higher quality, then lower $/h)
TIE_BREAKS: dict[str, tuple[str, str, str]] = {
    "latency": ("p95", "-quality", "cost"),
    "cost": ("cost", "p95", "-quality"),
    "quality": ("-quality", "cost", "p95"),
}


def dominates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether ``a`` dominates ``b`` (every column minimised; rows broadcast against each other): no worse
    everywhere and better somewhere. The one definition of Pareto dominance of the optimiser."""
    return np.all(a <= b, axis=-1) & np.any(a < b, axis=-1)


def nondominated(Y: np.ndarray) -> np.ndarray:
    """Rows of ``Y`` (n, m; every column minimised) that no other row dominates; exact duplicates are all kept."""
    Y = np.asarray(Y, dtype=float)
    if Y.size == 0:
        return np.zeros(len(Y), dtype=bool)
    return ~np.any(dominates(Y[None, :, :], Y[:, None, :]), axis=1)  # [i, j]: j dominates i


def front_layers(Y: np.ndarray, min_rows: int) -> np.ndarray:
    """Rows of ``Y`` (every column minimised) on its first non-dominated layers: the front, then the front of
    the rest, and so on until at least ``min_rows`` rows are kept (or all are). A mask.

    Why layers: a noisy baseline (qLogNEHVI's ``X_baseline``) matters only through the points that might be on
    the true front; a point behind several layers of observed plans would need every one of them to be
    mis-measured at once. Peeling layers is a deterministic, cheap stand-in for scoring each point's posterior
    probability of being non-dominated.
    """
    Y = np.asarray(Y, dtype=float)
    keep = np.zeros(len(Y), dtype=bool)
    while keep.sum() < min(min_rows, len(Y)):
        rest = np.flatnonzero(~keep)
        keep[rest[nondominated(Y[rest])]] = True
    return keep


def _floats(*columns: ArrayLike) -> tuple[np.ndarray, ...]:
    """Each column as a float array (callers pass lists or arrays alike)."""
    return tuple(np.asarray(v, dtype=float) for v in columns)


def _lex(*keys: np.ndarray) -> int:
    """Index of the lexicographic minimum over the key arrays (first key most significant)."""
    return int(np.lexsort(tuple(reversed(keys)))[0])


def _figure(name: str, q: np.ndarray, p: np.ndarray, c: np.ndarray) -> np.ndarray:
    return {"quality": q, "-quality": -q, "p95": p, "cost": c}[name]


def ranked(rule: str, quality: ArrayLike, p95: ArrayLike, cost: ArrayLike) -> list[int]:
    """Every plan, best first by the :data:`TIE_BREAKS` rule ``rule`` (a stable sort: equal plans keep their
    order)."""
    q, p, c = _floats(quality, p95, cost)
    keys = tuple(_figure(f, q, p, c) for f in TIE_BREAKS[rule])
    return [int(i) for i in np.lexsort(tuple(reversed(keys)))]


def tie_key(rule: str, quality: float, p95: float, cost: float) -> tuple[float, ...]:
    """One plan's sort key by the :data:`TIE_BREAKS` rule ``rule``: the smallest key is the rule's pick."""
    figures = {"quality": quality, "-quality": -quality, "p95": p95, "cost": cost}
    return tuple(figures[f] for f in TIE_BREAKS[rule])


def prefer_cost(q: np.ndarray, p: np.ndarray, c: np.ndarray, tg: Targets) -> int:
    return ranked("cost", q, p, c)[0]


def prefer_latency(q: np.ndarray, p: np.ndarray, c: np.ndarray, tg: Targets) -> int:
    return ranked("latency", q, p, c)[0]


def prefer_quality(q: np.ndarray, p: np.ndarray, c: np.ndarray, tg: Targets) -> int:
    return ranked("quality", q, p, c)[0]


def knee_goodness(q: np.ndarray, p: np.ndarray, c: np.ndarray, tg: Targets) -> np.ndarray:
    """(n, 3) goodness per axis: 0 at the target, 1 at the best value among the given plans (module doc)."""
    cols = (
        np.asarray(q, float) - tg.quality_floor,
        math.log(tg.p95_cap_s) - np.log(np.maximum(np.asarray(p, float), 1e-12)),
        tg.budget - np.asarray(c, float),
    )
    out = []
    for v in cols:
        top = float(np.max(v))
        out.append(np.ones_like(v) if top <= 1e-12 else np.clip(v / top, 0.0, 1.0))
    return np.stack(out, axis=1)


def prefer_knee(q: np.ndarray, p: np.ndarray, c: np.ndarray, tg: Targets) -> int:
    dist = np.linalg.norm(1.0 - knee_goodness(q, p, c, tg), axis=1)
    return _lex(np.round(dist, 12), c, p)


#: how ``--objective pareto`` picks the plan from the feasible front (``--prefer``)
PREFERENCES: Choices[PreferRule] = Choices(
    "rule",
    "--prefer",
    [
        ("knee", "nearest the ideal, axes scaled target..best", prefer_knee),
        ("cost", "cheapest", prefer_cost),
        ("latency", "lowest P95", prefer_latency),
        ("quality", "highest quality", prefer_quality),
    ],
)

#: what ``boute optimize --objective`` minimises among plans meeting the targets: the rule picking the
#: answer among them (None: ``pareto``, picked from their front by its ``--prefer`` rule)
OBJECTIVES: Choices[PreferRule | None] = Choices(
    "objective",
    "--objective",
    [
        ("latency", "lowest P95 (the paper's method)", prefer_latency),
        ("cost", "lowest $/h", prefer_cost),
        ("pareto", "quality x P95 x $/h front, --prefer picks", None),
    ],
)


@dataclass(frozen=True)
class Objective:
    """One objective (module doc); ``prefer`` only matters for ``pareto``. Unknown names are a BouteError
    naming the option (``--objective``, ``--prefer``)."""

    name: str = "latency"
    prefer: str = "knee"

    def __post_init__(self) -> None:
        OBJECTIVES.get(self.name)
        PREFERENCES.get(self.prefer)

    @classmethod
    def from_label(cls, label: str | None) -> Objective:
        """The objective a plan records as :attr:`label` (None: an older plan, chosen by ``latency``)."""
        name, _, prefer = (label or "latency").partition(":")
        return cls(name, prefer or "knee")

    @property
    def label(self) -> str:
        """What the plan records as the objective that chose it: ``latency``, ``cost`` or ``pareto:<prefer>``."""
        return f"pareto:{self.prefer}" if self.name == "pareto" else self.name

    @property
    def prefer_option(self) -> str | None:
        """The ``--prefer`` a search choosing by this objective is given: the rule for ``pareto``, else none."""
        return self.prefer if self.name == "pareto" else None

    @property
    def axes(self) -> tuple[str, ...]:
        """The front the tracking DB keeps for this objective (names of EvalResult fields)."""
        if self.name == "latency":
            return ("quality", "p95_latency_s")
        return ("quality", "p95_latency_s", "cost_per_hour")

    def rule(self) -> PreferRule:
        return OBJECTIVES.get(self.name) or PREFERENCES.get(self.prefer)

    def pick(self, quality: ArrayLike, p95: ArrayLike, cost: ArrayLike, feasible: ArrayLike, tg: Targets) -> int | None:
        """Index of the answer among plans with these figures, or None when none is ``feasible``.

        ``pareto`` picks from the 3-D front of the feasible plans; the others directly from the feasible
        plans (their best is on that front anyway).
        """
        q, p, c = _floats(quality, p95, cost)
        idx = np.flatnonzero(np.asarray(feasible, dtype=bool))
        if idx.size == 0:
            return None
        if self.name == "pareto":
            idx = idx[nondominated(np.stack([-q[idx], p[idx], c[idx]], axis=1))]
        return int(idx[self.rule()(q[idx], p[idx], c[idx], tg)])

    def order(self, quality: ArrayLike, p95: ArrayLike, cost: ArrayLike, tg: Targets) -> list[int]:
        """All plans ranked best-first by this objective alone (what the choice would take next)."""
        q, p, c = _floats(quality, p95, cost)
        if self.name != "pareto":
            return ranked(self.name, q, p, c)
        left = list(range(len(q)))
        out: list[int] = []
        while left:  # peel the choice off repeatedly: the order in which pareto would pick them
            sub = np.asarray(left)
            front = sub[nondominated(np.stack([-q[sub], p[sub], c[sub]], axis=1))]
            j = int(front[self.rule()(q[front], p[front], c[front], tg)])
            out.append(j)
            left.remove(j)
        return out


def make_objective(name: str, prefer: str | None = None) -> Objective:
    """The objective called ``name`` (``prefer`` for ``pareto``; default ``knee``)."""
    return Objective(name, prefer or "knee")


def objective_of_options(objective: str, prefer: str | None) -> Objective:
    """The objective ``--objective``/``--prefer`` name, checked as ``boute optimize`` spells them: a rule
    only picks from the pareto front, so ``--prefer`` needs ``--objective pareto``."""
    chosen = make_objective(objective, prefer)
    if prefer is not None and objective != "pareto":
        raise BouteError(f"--prefer: picks a plan from the pareto front; it needs --objective pareto, not {objective}")
    return chosen
