"""Plan -> desired replica set, with ids that stay the same across plans for the same replica.

Why stable ids: a rolling update keeps every replica whose (tier, model, GPU, TP, PP, dtype, index) is in
both plans untouched, and only starts/stops the difference. The index counts replicas of the same kind
within a tier, so growing a group from 2 to 3 replicas adds exactly one id and shrinks remove the last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from boute.specs.plan import Plan


@dataclass(frozen=True, order=True)
class ReplicaKey:
    """One replica the plan asks for; ``id`` is its stable name (also its log file and registry name)."""

    tier: str
    model: str
    gpu: str
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    index: int = 0

    @property
    def id(self) -> str:
        return f"{self.tier}.{self.model}.{self.gpu}.tp{self.tp}pp{self.pp}.{self.dtype}.{self.index}"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaKey:
        return cls(**{k: d[k] for k in ("tier", "model", "gpu", "tp", "pp", "dtype", "index")})


def desired_replicas(plan: Plan) -> list[ReplicaKey]:
    """Every replica of the plan, in plan order; groups of the same kind in one tier share an index range."""
    seen: dict[tuple[str, str, str, int, int, str], int] = {}
    out: list[ReplicaKey] = []
    for g in plan.deployment:
        kind = (g.tier, g.model, g.gpu, g.tp, g.pp, g.dtype)
        start = seen.get(kind, 0)
        out += [ReplicaKey(*kind, index=start + i) for i in range(g.count)]
        seen[kind] = start + g.count
    return out
