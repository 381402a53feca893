"""Fit the performance model's shared terms and family efficiencies on published rows.

Every parameter has a physical meaning and is shared by many rows; nothing is per row or per source:

- GEMM efficiency: ``logit = base[dtype] + offset[architecture] + offset[architecture, dtype]`` (offsets
  pulled to 0 by ridge priors, the pair offset more strongly, so an architecture without rows falls back to
  the dtype's base, and a dtype without rows on an architecture to the architecture's other dtypes: FP8
  kernels on Ada are less mature than BF16 ones, which one shared offset could not express);
- bandwidth efficiency: ``logit = base + offset[memory technology]`` (same prior);
- link efficiency and the latency of an NCCL transfer (ring hop, PP hand-off) per link family (NVLink,
  PCIe), and the fixed latency of a custom-kernel all-reduce (NVLink only: engines run NCCL without it);
- GPU-independent structure: tokens for half GEMM efficiency, roofline sharpness, attention, KV-read
  and routed-expert efficiency, the serial share of pipeline stages, and a fixed step overhead per engine
  family (TensorRT-LLM, vLLM; SGLang takes the TensorRT-LLM value:
  no published SGLang rows are in the dataset).

Residuals are ``log(predicted / published)`` weighted by ``1/sqrt(rows of the source)`` so that one
large table does not outvote the others. ``python -m boute.perf.fit`` re-fits on every in-scope row and
writes ``boute/perf/data/fit.json``; ``boute.perf.validate`` re-fits with sources or GPUs left out.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from boute.catalog import Catalog, builtin_catalog
from boute.perf.dataset import PublishedRow, in_scope_rows
from boute.perf.engines import engine_spec
from boute.perf.model import allreduce_limits, make_rates, peak_tflops, replica_perf
from boute.perf.physics import Rates, Shape
from boute.perf.serving import saturated_throughput, serving_point, static_batch
from boute.perf.structure import LINK_FAMILIES, Families, FittedModel, Structure, link_family, logit, sigmoid

DTYPES = ("bf16", "fp8", "fp4")
ARCHS = ("ampere", "ada", "hopper", "blackwell")
MEMORIES = ("hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7")
#: engine overhead keys with rows. No published SGLang row is in the dataset, so "sglang" (BOute's engine)
#: takes the TensorRT-LLM value: fitted on ~900 rows, and like SGLang a CUDA-graph decode loop; the vLLM
#: value rests on 10 rows of one third-party benchmark
OVERHEADS = ("trtllm", "vllm")
SGLANG_OVERHEAD_FROM = "trtllm"

#: parameter name -> (start value in fit space, prior weight towards the start)
START: dict[str, tuple[float, float]] = {
    **{f"c_{d}": (logit(v), 0.02) for d, v in zip(DTYPES, (0.65, 0.55, 0.45), strict=True)},
    **{f"arch_{a}": (0.0, 0.3) for a in ARCHS},
    **{f"ad_{a}_{d}": (0.0, 0.5) for a in ARCHS for d in DTYPES},
    "bw": (logit(0.8), 0.02),
    **{f"mem_{m}": (0.0, 0.3) for m in MEMORIES},
    "link_nvlink": (logit(0.5), 0.05),
    "link_pcie": (logit(0.5), 0.05),
    "lat_nvlink": (math.log(8.0), 0.05),
    "hop_nvlink": (math.log(8.0), 0.05),
    "hop_pcie": (math.log(25.0), 0.05),
    "gemm_half": (math.log(64.0), 0.02),
    "p": (math.log(1.0), 0.02),  # roofline sharpness = 1 + exp(x)
    "attn": (logit(0.5), 0.02),
    "kv": (math.log(1.0), 0.05),
    "moe": (logit(0.7), 0.05),
    "pp_serial": (logit(0.05), 0.05),
    "oh_trtllm": (math.log(1.0), 0.02),
    "oh_vllm": (math.log(1.5), 0.02),
    "sq_trtllm": (math.log(1.0), 0.02),  # microseconds per sequence in a step
    "sq_vllm": (math.log(1.0), 0.05),
}
NAMES: tuple[str, ...] = tuple(START)
#: bounds in fit space (keep exp/logit terms in physical ranges)
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_half": (math.log(1.0), math.log(2048.0)),
    "p": (math.log(1e-3), math.log(20.0)),
    "kv": (math.log(0.2), math.log(1.5)),
    "lat_nvlink": (math.log(0.5), math.log(200.0)),
    "hop_nvlink": (math.log(0.5), math.log(200.0)),
    "hop_pcie": (math.log(0.5), math.log(500.0)),
    "oh_trtllm": (math.log(0.01), math.log(30.0)),
    "oh_vllm": (math.log(0.01), math.log(30.0)),
    "sq_trtllm": (math.log(0.01), math.log(200.0)),
    "sq_vllm": (math.log(0.01), math.log(200.0)),
}


def _bounds() -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([BOUNDS.get(n, (-8.0, 8.0))[0] for n in NAMES])
    hi = np.array([BOUNDS.get(n, (-8.0, 8.0))[1] for n in NAMES])
    return lo, hi


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


def structure_of(x: np.ndarray) -> Structure:
    v = dict(zip(NAMES, x, strict=True))
    return Structure(
        gemm_half_tokens=math.exp(v["gemm_half"]),
        roofline_p=1.0 + math.exp(v["p"]),
        attn_efficiency=sigmoid(v["attn"]),
        kv_read_efficiency=math.exp(v["kv"]),
        moe_efficiency=sigmoid(v["moe"]),
        pp_serial=sigmoid(v["pp_serial"]),
        # custom all-reduce kernels need NVLink: on PCIe every all-reduce goes through NCCL's ring
        allreduce_latency_us={"nvlink": math.exp(v["lat_nvlink"]), "pcie": 0.0, "cpu": 0.0},
        ring_hop_latency_us={"nvlink": math.exp(v["hop_nvlink"]), "pcie": math.exp(v["hop_pcie"]), "cpu": 0.0},
        engine_overhead_ms={
            "trtllm": math.exp(v["oh_trtllm"]),
            "vllm": math.exp(v["oh_vllm"]),
            "sglang": math.exp(v[f"oh_{SGLANG_OVERHEAD_FROM}"]),
        },
        seq_overhead_us={
            "trtllm": math.exp(v["sq_trtllm"]),
            "vllm": math.exp(v["sq_vllm"]),
            "sglang": math.exp(v[f"sq_{SGLANG_OVERHEAD_FROM}"]),
        },
    )


def families_of(x: np.ndarray) -> Families:
    v = dict(zip(NAMES, x, strict=True))
    st = structure_of(x)
    return Families(
        compute_logit={d: v[f"c_{d}"] for d in DTYPES},
        arch_logit={a: v[f"arch_{a}"] for a in ARCHS},
        pair_logit={f"{a}/{d}": v[f"ad_{a}_{d}"] for a in ARCHS for d in DTYPES},
        bandwidth_logit=v["bw"],
        memory_logit={m: v[f"mem_{m}"] for m in MEMORIES},
        link={"nvlink": sigmoid(v["link_nvlink"]), "pcie": sigmoid(v["link_pcie"])},
        step_overhead_ms=st.engine_overhead_ms["sglang"],
    )


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def predict(table: RowTable, x: np.ndarray) -> np.ndarray:
    """The model's value for every row of ``table`` under parameters ``x`` (the rows' own units)."""
    v = dict(zip(NAMES, x, strict=True))
    st = structure_of(x)
    base = np.array([v[f"c_{d}"] for d in DTYPES])
    arch = np.array([v[f"arch_{a}"] for a in ARCHS] + [0.0])
    pair = np.array([[v[f"ad_{a}_{d}"] for d in DTYPES] for a in ARCHS] + [[0.0] * len(DTYPES)])
    mem = np.array([v[f"mem_{m}"] for m in MEMORIES] + [0.0])
    link = _sig(np.array([v["link_nvlink"], v["link_pcie"]]))
    # per link family (index as RowTable.link_idx), as the structure defines them
    lat = np.array([st.allreduce_latency_us[f] for f in LINK_FAMILIES]) * 1e-6
    hop = np.array([st.ring_hop_latency_us[f] for f in LINK_FAMILIES]) * 1e-6
    oh = np.exp(np.array([v[f"oh_{k}"] for k in OVERHEADS]))
    sq = np.exp(np.array([v[f"sq_{k}"] for k in OVERHEADS]))
    t = table
    rates = make_rates(
        gemm_peak_tflops=t.gemm_peak,
        bf16_peak_tflops=t.bf16_peak,
        bandwidth_gbs=t.bandwidth_gbs,
        link_gbs=t.link_gbs,
        tp=t.shape.tp,
        compute=_sig(base[t.dtype_idx] + arch[t.arch_idx] + pair[t.arch_idx, t.dtype_idx]),
        compute_bf16=_sig(base[t.bf16_idx] + arch[t.arch_idx] + pair[t.arch_idx, t.bf16_idx]),
        bandwidth=_sig(v["bw"] + mem[t.mem_idx]),
        link=link[t.link_idx],
        overhead_ms=oh[t.oh_idx],
        allreduce_latency_s=lat[t.link_idx],
        structure=st,
        seq_overhead_us=sq[t.oh_idx],
        ring_hop_latency_s=hop[t.link_idx],
        oneshot_max_bytes=t.oneshot_max_bytes,
        custom_max_bytes=t.custom_max_bytes,
    )
    return predict_rows(table, rates)


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
        ttft, _, thr = static_batch(r_, s_, b, i, o)
        out[idx] = np.where(m == "ttft_ms", ttft * 1e3, thr)

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


def x0() -> np.ndarray:
    return np.array([START[n][0] for n in NAMES])


def fit_table(table: RowTable, start: np.ndarray | None = None, *, max_nfev: int = 200) -> np.ndarray:
    """Least-squares parameters for ``table`` (weighted log residuals + priors towards :data:`START`)."""
    from scipy.optimize import least_squares  # heavy import kept off the CLI start-up path

    prior_x = x0()
    prior_w = np.array([START[n][1] for n in NAMES])
    lo, hi = _bounds()
    s = np.clip(x0() if start is None else start, lo + 1e-9, hi - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict(table, x)
        pred = np.where(np.isfinite(pred) & (pred > 0), pred, 1e-9)
        return np.concatenate([table.weight * np.log(pred / table.value), prior_w * (x - prior_x)])

    sol = least_squares(
        residuals, s, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, max_nfev=max_nfev, ftol=1e-6, xtol=1e-6
    )
    return np.asarray(sol.x)


def fit_packaged(rows: Sequence[PublishedRow] | None = None, catalog: Catalog | None = None) -> FittedModel:
    """The fit on every in-scope row: what ``boute/perf/data/fit.json`` holds."""
    rs = tuple(rows) if rows is not None else in_scope_rows()
    table = build_table(rs, catalog)
    x = fit_table(table)
    err = 100.0 * (predict(table, x) / table.value - 1.0)
    meta = {
        "rows": len(rs),
        "sources": len({r.source_id for r in rs}),
        "median_abs_error_pct_in_sample": round(float(np.median(np.abs(err))), 2),
        "parameters": {n: round(float(v), 6) for n, v in zip(NAMES, x, strict=True)},
        "how": "python -m boute.perf.fit (weighted log least squares on in-scope rows of published.csv)",
    }
    return FittedModel(structure_of(x), families_of(x), meta)


def params_of(fitted: FittedModel) -> np.ndarray:
    """The fit-space vector stored in a fitted model's metadata."""
    p = fitted.meta["parameters"]
    return np.array([float(p[n]) for n in NAMES])


FIT_PATH = Path(__file__).parent / "data" / "fit.json"
GPUS_YAML = Path(__file__).resolve().parents[1] / "catalog" / "gpus.yaml"


def efficiency_line(eff_dump: dict[str, float]) -> str:
    return "    efficiency: {" + ", ".join(f"{k}: {v:g}" for k, v in eff_dump.items()) + "}"


def update_gpus_yaml(fitted: FittedModel, path: Path = GPUS_YAML) -> None:
    """Rewrite each GPU's ``efficiency:`` line in gpus.yaml with its families' fitted values (comments kept)."""
    cat = builtin_catalog()
    out, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("  - name: "):
            current = line.split(": ", 1)[1].strip()
        if line.startswith("    efficiency: {") and current is not None and current in cat.gpus:
            eff = fitted.families.efficiency_for(cat.gpu(current))
            line = efficiency_line(eff.model_dump(exclude_none=True))
        out.append(line)
    path.write_text("\n".join(out) + "\n")


def main(argv: Sequence[str] = ()) -> int:
    """Re-fit on every in-scope row, write fit.json and the packaged GPU efficiencies in gpus.yaml."""
    fitted = fit_packaged()
    FIT_PATH.write_text(json.dumps(fitted.to_json(), indent=2, sort_keys=False) + "\n")
    update_gpus_yaml(fitted)
    sys.stdout.write(json.dumps(fitted.to_json()["meta"], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
