"""Published rows as arrays, and each row's prediction through the regime its benchmark ran.

:func:`build_table` turns rows into per-row constants the fit never changes (model shape, peaks, engine
limits, KV capacity, index columns into the fitted families); :func:`predict_rows` takes per-row rates
and returns each row's value in its own units (static batch, saturated engine or steady serving point).
:mod:`boute.perf.fit` maps parameters to rates and fits them; :mod:`boute.perf.validate` holds rows out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from boute.catalog import Catalog, builtin_catalog
from boute.perf.dataset import PublishedRow
from boute.perf.engines import engine_spec
from boute.perf.model import allreduce_limits, peak_tflops, replica_perf
from boute.perf.physics import Rates, Shape
from boute.perf.serving import saturated_throughput, serving_point, static_batch
from boute.perf.structure import LINK_FAMILIES, link_family

DTYPES = ("bf16", "fp8", "fp4")
ARCHS = ("ampere", "ada", "hopper", "blackwell")
MEMORIES = ("hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7")
#: engine overhead keys with rows. No published SGLang row is in the dataset, so "sglang" (BOute's engine)
#: takes the TensorRT-LLM value: fitted on ~900 rows, and like SGLang a CUDA-graph decode loop; the vLLM
#: value rests on 10 rows of one third-party benchmark
OVERHEADS = ("trtllm", "vllm")
SGLANG_OVERHEAD_FROM = "trtllm"
#: TensorRT-LLM releases with rows, oldest first. Kernels get faster from release to release (the same
#: configuration's throughput rose 10-55% from v0.12 to v0.17 in NVIDIA's own tables), so each release has
#: one fitted speed, and consecutive releases are pulled together: a release without rows (a held-out one)
#: takes its neighbours' speed
TRTLLM_RELEASES = (
    "0.5",
    "0.6.1",
    "0.9.0",
    "0.10.0",
    "0.11.0",
    "0.12.0",
    "0.13.0",
    "0.14.0",
    "0.15.0",
    "0.17.0",
    "0.20.0",
    "0.21.0",
    "1.0",
    "1.x",
    "1.2",
)
#: engines outside that chain, one fitted speed each (NIM containers do not state their TensorRT-LLM release)
ENGINE_SPEEDS = ("nim", "vllm")
#: every fitted speed: the engines', then the releases'. A speed scales the row's tensor and memory peaks.
#: The reference (speed 1, what the shared efficiencies describe) is the newest release with rows, and
#: BOute's SGLang runs at it, as it takes TensorRT-LLM's step overhead
SPEEDS = ENGINE_SPEEDS + TRTLLM_RELEASES


def speed_of(row: PublishedRow) -> int:
    """Index of the row's engine speed in :data:`SPEEDS` (-1: the reference, for SGLang)."""
    if row.engine.startswith("trtllm"):
        release = row.engine_version.split()[0]
        if release not in TRTLLM_RELEASES:
            raise ValueError(f"row {row.id}: TensorRT-LLM release '{row.engine_version}' is not in TRTLLM_RELEASES")
        return SPEEDS.index(release)
    return SPEEDS.index(row.engine) if row.engine in ENGINE_SPEEDS else -1


@dataclass(frozen=True)
class RowTable:
    """Per-row constants the fit never changes (model shape, peaks, engine limits, KV capacity)."""

    rows: tuple[PublishedRow, ...]
    shape: Shape
    gemm_peak: np.ndarray
    bf16_peak: np.ndarray
    bandwidth_gbs: np.ndarray
    link_gbs: np.ndarray
    dtype_idx: np.ndarray
    bf16_idx: np.ndarray
    arch_idx: np.ndarray  # -1: no fitted offset
    mem_idx: np.ndarray
    link_idx: np.ndarray  # index in LINK_FAMILIES (nvlink, pcie)
    oh_idx: np.ndarray
    speed_idx: np.ndarray  # index in SPEEDS, -1: the reference speed
    kv_tokens: np.ndarray
    max_batch: np.ndarray
    max_step_tokens: np.ndarray
    mixed: np.ndarray
    reserve_output: np.ndarray
    oneshot_max_bytes: np.ndarray
    custom_max_bytes: np.ndarray
    value: np.ndarray
    weight: np.ndarray

    def subset(self, mask: np.ndarray) -> RowTable:
        """The rows where ``mask`` holds (source weights renormalised)."""
        idx = np.flatnonzero(mask)
        sub: dict[str, Any] = {
            k: getattr(self, k)[idx] for k in self.__dataclass_fields__ if isinstance(getattr(self, k), np.ndarray)
        }
        sub["rows"] = tuple(self.rows[i] for i in idx)
        sub["shape"] = Shape(**{k: getattr(self.shape, k)[idx] for k in Shape.__dataclass_fields__})
        w = sub["weight"]
        sub["weight"] = w / np.sqrt(np.mean(w**2))
        return RowTable(**sub)


def _source_weights(rows: Sequence[PublishedRow]) -> np.ndarray:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.source_id] = counts.get(r.source_id, 0) + 1
    w = np.array([1.0 / math.sqrt(counts[r.source_id]) for r in rows])
    return w / np.sqrt(np.mean(w**2))


def build_table(rows: Sequence[PublishedRow], catalog: Catalog | None = None) -> RowTable:
    """Arrays of everything about the rows that does not depend on the fitted parameters."""
    cat = catalog or builtin_catalog()
    shapes: list[Shape] = []
    keys = ("gp", "bp", "bw", "lk", "di", "ai", "mi", "li", "oi", "kv", "mb", "ms", "mx", "ro", "os", "cu")
    cols: dict[str, list[Any]] = {k: [] for k in keys}
    for r in rows:
        m, g = cat.model(r.model), cat.gpu(r.gpu)
        eng = engine_spec(r.engine)
        perf = replica_perf(m, g, r.tp, r.pp, r.dtype, kv_dtype=r.kv_dtype, engine=eng)
        if not perf.fits:
            raise ValueError(f"row {r.id} ({r.label}) does not fit in the model's memory accounting: {perf.reason}")
        shapes.append(perf.shape)
        cols["gp"].append(peak_tflops(g, r.dtype))
        cols["bp"].append(g.tflops_bf16)
        cols["bw"].append(g.bandwidth_gbs)
        cols["lk"].append(g.link_gbs)
        cols["di"].append(DTYPES.index(r.dtype))
        cols["ai"].append(ARCHS.index(g.arch) if g.arch in ARCHS else -1)
        cols["mi"].append(MEMORIES.index(g.memory_type) if g.memory_type in MEMORIES else -1)
        cols["li"].append(LINK_FAMILIES.index("nvlink" if link_family(g.link) == "nvlink" else "pcie"))
        cols["oi"].append(OVERHEADS.index(SGLANG_OVERHEAD_FROM if eng.overhead_key == "sglang" else eng.overhead_key))
        cols["kv"].append(perf.kv_capacity_tokens)
        cols["mb"].append(eng.max_batch)
        cols["ms"].append(eng.max_step_tokens)
        cols["mx"].append(eng.mixed_prefill)
        cols["ro"].append(eng.reserve_output)
        limits = allreduce_limits(eng, g, r.tp)
        cols["os"].append(limits["oneshot_max_bytes"])
        cols["cu"].append(limits["custom_max_bytes"])
    shape = Shape(**{k: np.array([float(getattr(s, k)) for s in shapes]) for k in Shape.__dataclass_fields__})
    a = np.asarray
    return RowTable(
        rows=tuple(rows),
        shape=shape,
        gemm_peak=a(cols["gp"], dtype=float),
        bf16_peak=a(cols["bp"], dtype=float),
        bandwidth_gbs=a(cols["bw"], dtype=float),
        link_gbs=a(cols["lk"], dtype=float),
        dtype_idx=a(cols["di"]),
        bf16_idx=np.zeros(len(rows), dtype=int),
        arch_idx=a(cols["ai"]),
        mem_idx=a(cols["mi"]),
        link_idx=a(cols["li"]),
        oh_idx=a(cols["oi"]),
        speed_idx=a([speed_of(r) for r in rows], dtype=int),
        kv_tokens=a(cols["kv"], dtype=float),
        max_batch=a(cols["mb"], dtype=float),
        max_step_tokens=a(cols["ms"], dtype=float),
        mixed=a(cols["mx"], dtype=bool),
        reserve_output=a(cols["ro"], dtype=bool),
        oneshot_max_bytes=a(cols["os"], dtype=float),
        custom_max_bytes=a(cols["cu"], dtype=float),
        value=a([r.value for r in rows], dtype=float),
        weight=_source_weights(rows),
    )


class _ArrayRecord(Protocol):
    """A dataclass whose fields are arrays (Rates, Shape)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


_T = TypeVar("_T", bound=_ArrayRecord)


def _take(obj: _T, idx: np.ndarray) -> _T:
    """The rows ``idx`` of a dataclass of arrays (0-d fields broadcast and are kept)."""
    return type(obj)(
        **{k: (v[idx] if np.ndim(v) else v) for k, v in ((k, getattr(obj, k)) for k in obj.__dataclass_fields__)}
    )


def predict_rows(table: RowTable, rates: Rates) -> np.ndarray:
    """Row values from per-row rates: each row through the regime its benchmark ran."""
    t, rows = table, table.rows
    i_all = np.array([r.input_len for r in rows], dtype=float)
    o_all = np.array([r.output_len for r in rows], dtype=float)
    metric = np.array([r.metric for r in rows])
    mode = np.array([r.mode for r in rows])
    out = np.full(len(rows), np.nan)

    def part(sel: np.ndarray) -> tuple[np.ndarray, Rates, Shape, np.ndarray, np.ndarray, np.ndarray]:
        idx = np.flatnonzero(sel)
        return idx, _take(rates, idx), _take(t.shape, idx), i_all[idx], o_all[idx], metric[idx]

    if (mode == "static").any():
        idx, r_, s_, i, o, m = part(mode == "static")
        b = np.array([rows[k].batch or 1 for k in idx], dtype=float)
        b = np.minimum(b, np.maximum(1.0, np.floor(t.kv_tokens[idx] / (i + o))))
        ttft, tpot, thr = static_batch(r_, s_, b, i, o)
        out[idx] = np.where(m == "ttft_ms", ttft * 1e3, np.where(m == "tpot_ms", tpot * 1e3, thr))

    if (mode == "max_throughput").any():
        idx, r_, s_, i, o, m = part(mode == "max_throughput")
        out[idx] = saturated_throughput(
            r_,
            s_,
            i,
            o,
            kv_tokens=t.kv_tokens[idx],
            max_batch=t.max_batch[idx],
            max_step_tokens=t.max_step_tokens[idx],
            mixed=t.mixed[idx],
            reserve_output=t.reserve_output[idx],
        )

    for md in ("online_rate", "concurrency"):
        if not (mode == md).any():
            continue
        idx, r_, s_, i, o, m = part(mode == md)
        load = np.array([(rows[k].rate_rps if md == "online_rate" else rows[k].concurrency) or 1.0 for k in idx])
        rate, conc = (load, None) if md == "online_rate" else (None, load)
        pt = serving_point(
            r_, s_, i, o, rate=rate, concurrency=conc, max_step_tokens=t.max_step_tokens[idx], mixed=t.mixed[idx]
        )
        val = np.where(m == "ttft_ms", pt["ttft_s"] * 1e3, np.where(m == "tpot_ms", pt["itl_s"] * 1e3, 0.0))
        out[idx] = np.where(m == "output_tokens_per_s", pt["output_tokens_per_s"], val)
    per_gpu = np.array([r.per_gpu for r in rows]) & (metric == "output_tokens_per_s")
    return np.where(per_gpu, out / (t.shape.tp * t.shape.pp), out)
