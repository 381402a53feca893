"""The fitted terms of the performance model, shared by every GPU, and the per-family efficiencies.

Two kinds of numbers come out of the fit on published measurements (``boute.perf.fit``):

- **structure** (:class:`Structure`): terms with one value for all GPUs: how many tokens a GEMM needs to
  reach half its efficiency, how much compute and memory traffic overlap, how efficient attention and
  KV reads are relative to GEMMs and weight streaming, the fixed cost of a custom-kernel all-reduce and
  of an NCCL ring hop per link family,
  and each engine's fixed per-step overhead.
- **families** (:class:`Families`): compute efficiency by weight dtype and architecture, bandwidth
  efficiency by memory technology and architecture, link efficiency by link family. A GPU's packaged ``efficiency`` in
  ``gpus.yaml`` is its family's value (:meth:`Families.efficiency_for`), so a GPU with no published rows
  still gets a value from GPUs that share its architecture or memory; a calibration file overrides it.

Both are stored in ``boute/perf/data/fit.json`` (written by ``python -m boute.perf.fit``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from boute.catalog.schema import Efficiency, GPUSpec

#: link families with a fitted all-reduce latency and link efficiency
LINK_FAMILIES: tuple[str, ...] = ("nvlink", "pcie")


def link_family(link: str) -> str:
    """``nvlink`` for NVLink parts, ``cpu`` for host engines (no link), else ``pcie``."""
    if link.startswith("nvlink"):
        return "nvlink"
    if link.startswith("cpu"):
        return "cpu"
    return "pcie"


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _frozen(d: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType({k: float(v) for k, v in d.items()})


@dataclass(frozen=True)
class Structure:
    """GPU-independent terms of the step time (see :mod:`boute.perf.physics`)."""

    #: tokens per step at which a GEMM reaches half its large-batch efficiency (tile under-use)
    gemm_half_tokens: float = 64.0
    #: roofline sharpness p: time = (compute^p + memory^p)^(1/p); 1 = no overlap, large = full overlap
    roofline_p: float = 1.0
    #: attention FLOP efficiency relative to the GEMM efficiency of the 16-bit rate
    attn_efficiency: float = 0.5
    #: KV-cache read bandwidth relative to weight streaming
    kv_read_efficiency: float = 1.0
    #: routed-expert GEMM efficiency relative to dense GEMMs (MoE)
    moe_efficiency: float = 1.0
    #: share of a step's work that pipeline stages cannot overlap (throughput with pp > 1)
    pp_serial: float = 0.0
    #: synchronisation cost of one custom-kernel all-reduce at TP 2, microseconds, by link family (0 where
    #: engines run none); it grows as log2 tp (:func:`boute.perf.physics.allreduce_time`)
    allreduce_latency_us: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"nvlink": 8.0, "pcie": 25.0, "cpu": 0.0})
    )
    #: cost of one NCCL transfer (a ring all-reduce has 2 (tp - 1); a pipeline hand-off one), microseconds
    ring_hop_latency_us: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"nvlink": 8.0, "pcie": 25.0, "cpu": 0.0})
    )
    #: fixed cost of one step (scheduling, launches, sampling), milliseconds, by engine
    engine_overhead_ms: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"trtllm": 1.0, "vllm": 1.5, "sglang": 1.5})
    )

    #: cost of each sequence in a step (per-request scheduling, sampling, streaming), microseconds, by engine
    seq_overhead_us: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"trtllm": 0.0, "vllm": 0.0, "sglang": 0.0})
    )

    def seq_overhead_us_for(self, key: str) -> float:
        return self.seq_overhead_us.get(key, 0.0)

    def allreduce_latency_s(self, link: str) -> float:
        return self.allreduce_latency_us.get(link_family(link), 0.0) * 1e-6

    def ring_hop_latency_s(self, link: str) -> float:
        return self.ring_hop_latency_us.get(link_family(link), 0.0) * 1e-6

    def overhead_ms(self, key: str) -> float:
        return self.engine_overhead_ms[key]


@dataclass(frozen=True)
class Families:
    """Efficiency factors by hardware family, additive in logit space (compute: dtype base + architecture
    offsets; bandwidth: base + memory-technology and architecture offsets)."""

    #: logit of the GEMM compute efficiency per weight dtype (bf16, fp8, fp4), before the architecture offset
    compute_logit: Mapping[str, float]
    #: logit offset per architecture (ampere, ada, hopper, blackwell); absent = 0 (no rows for it)
    arch_logit: Mapping[str, float]
    #: logit offset per "architecture/dtype" pair (e.g. "ada/fp8"); absent = 0
    pair_logit: Mapping[str, float]
    #: logit of the bandwidth efficiency shared by all memory, and the offset per memory technology
    bandwidth_logit: float
    memory_logit: Mapping[str, float]
    #: link efficiency per link family
    link: Mapping[str, float]
    #: the overhead packaged GPUs carry: BOute's engine (SGLang)
    step_overhead_ms: float
    #: logit offset of the bandwidth efficiency per architecture: memory controllers and the engines'
    #: kernels differ by generation (in the published tables the B200 reaches a far smaller share of its
    #: HBM3e peak than the H200 of the same memory), so memory technology alone is not enough; absent = 0
    bandwidth_arch_logit: Mapping[str, float] = field(default_factory=lambda: _frozen({}))

    def compute(self, dtype: str, arch: str | None) -> float:
        a = arch or ""
        return sigmoid(
            self.compute_logit[dtype] + self.arch_logit.get(a, 0.0) + self.pair_logit.get(f"{a}/{dtype}", 0.0)
        )

    def bandwidth(self, memory_type: str | None, arch: str | None) -> float:
        return sigmoid(
            self.bandwidth_logit
            + self.memory_logit.get(memory_type or "", 0.0)
            + self.bandwidth_arch_logit.get(arch or "", 0.0)
        )

    def efficiency_for(self, gpu: GPUSpec) -> Efficiency:
        """The packaged efficiency of ``gpu``: its families' fitted values (rounded to 3 digits)."""
        fam = link_family(gpu.link)
        return Efficiency(
            compute=round(self.compute("bf16", gpu.arch), 3),
            compute_fp8=round(self.compute("fp8", gpu.arch), 3) if gpu.tflops_fp8 else None,
            compute_fp4=round(self.compute("fp4", gpu.arch), 3) if gpu.tflops_fp4 else None,
            bandwidth=round(self.bandwidth(gpu.memory_type, gpu.arch), 3),
            link=round(self.link.get(fam, self.link["pcie"]), 3),
            step_overhead_ms=round(self.step_overhead_ms, 3),
        )


@dataclass(frozen=True)
class FittedModel:
    structure: Structure
    families: Families
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, Any]:
        s, f = self.structure, self.families
        return {
            "structure": {
                "gemm_half_tokens": s.gemm_half_tokens,
                "roofline_p": s.roofline_p,
                "attn_efficiency": s.attn_efficiency,
                "kv_read_efficiency": s.kv_read_efficiency,
                "moe_efficiency": s.moe_efficiency,
                "pp_serial": s.pp_serial,
                "allreduce_latency_us": dict(s.allreduce_latency_us),
                "ring_hop_latency_us": dict(s.ring_hop_latency_us),
                "engine_overhead_ms": dict(s.engine_overhead_ms),
                "seq_overhead_us": dict(s.seq_overhead_us),
            },
            "families": {
                "compute_logit": dict(f.compute_logit),
                "arch_logit": dict(f.arch_logit),
                "pair_logit": dict(f.pair_logit),
                "bandwidth_logit": f.bandwidth_logit,
                "memory_logit": dict(f.memory_logit),
                "bandwidth_arch_logit": dict(f.bandwidth_arch_logit),
                "link": dict(f.link),
                "step_overhead_ms": f.step_overhead_ms,
            },
            "meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FittedModel:
        s, f = data["structure"], data["families"]
        structure = Structure(
            gemm_half_tokens=float(s["gemm_half_tokens"]),
            roofline_p=float(s["roofline_p"]),
            attn_efficiency=float(s["attn_efficiency"]),
            kv_read_efficiency=float(s["kv_read_efficiency"]),
            moe_efficiency=float(s["moe_efficiency"]),
            pp_serial=float(s["pp_serial"]),
            allreduce_latency_us=_frozen({**s["allreduce_latency_us"], "cpu": 0.0}),
            ring_hop_latency_us=_frozen({**s.get("ring_hop_latency_us", s["allreduce_latency_us"]), "cpu": 0.0}),
            engine_overhead_ms=_frozen(s["engine_overhead_ms"]),
            seq_overhead_us=_frozen(s.get("seq_overhead_us", {})),
        )
        families = Families(
            compute_logit=_frozen(f["compute_logit"]),
            arch_logit=_frozen(f["arch_logit"]),
            pair_logit=_frozen(f.get("pair_logit", {})),
            bandwidth_logit=float(f["bandwidth_logit"]),
            memory_logit=_frozen(f["memory_logit"]),
            link=_frozen(f["link"]),
            step_overhead_ms=float(f["step_overhead_ms"]),
            bandwidth_arch_logit=_frozen(f.get("bandwidth_arch_logit", {})),
        )
        return cls(structure, families, MappingProxyType(dict(data.get("meta", {}))))


@lru_cache(maxsize=1)
def packaged_fit() -> FittedModel:
    """The fit shipped in ``boute/perf/data/fit.json`` (defaults if the file is missing, e.g. mid-refit)."""
    path = resources.files("boute.perf") / "data" / "fit.json"
    try:
        return FittedModel.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        fam = Families(
            compute_logit=_frozen({"bf16": logit(0.6), "fp8": logit(0.5), "fp4": logit(0.4)}),
            arch_logit=_frozen({}),
            pair_logit=_frozen({}),
            bandwidth_logit=logit(0.8),
            memory_logit=_frozen({}),
            link=_frozen({"nvlink": 0.5, "pcie": 0.5}),
            step_overhead_ms=1.5,
        )
        return FittedModel(Structure(), fam)


def packaged_structure() -> Structure:
    return packaged_fit().structure
