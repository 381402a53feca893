"""Fit the performance model's shared terms and family efficiencies on published rows.

Every parameter has a physical meaning and is shared by many rows; nothing is per row:

- GEMM efficiency: ``logit = base[dtype] + offset[architecture] + offset[architecture, dtype]`` (offsets
  pulled to 0 by ridge priors, the pair offset more strongly, so an architecture without rows falls back to
  the dtype's base, and a dtype without rows on an architecture to the architecture's other dtypes: FP8
  kernels on Ada are less mature than BF16 ones, which one shared offset could not express);
- bandwidth efficiency: ``logit = base + offset[memory technology] + offset[architecture]`` (same
  prior): memory technology alone made the H200 and the B200 (both HBM3e) share one efficiency;
- link efficiency and the latency of an NCCL transfer (ring hop, PP hand-off) per link family (NVLink,
  PCIe), and the fixed latency of a custom-kernel all-reduce (NVLink only: engines run NCCL without it);
- GPU-independent structure: tokens for half GEMM efficiency, roofline sharpness, attention, KV-read
  and routed-expert efficiency, the serial share of pipeline stages, and a fixed step overhead per engine
  family (TensorRT-LLM, vLLM; SGLang takes the TensorRT-LLM value:
  no published SGLang rows are in the dataset);
- a speed per TensorRT-LLM release and per other engine (NIM, vLLM), scaling the row's tensor and memory
  peaks: releases are chained (each pulled towards the one before), the newest release with rows is the
  reference the shared efficiencies describe, and BOute's SGLang runs at that reference. Most releases have
  one table, so these are close to per-source terms: held out, a release is predicted at its neighbours'
  speed, which is what the leave-one-source-out figures measure.

Residuals are ``log(predicted / published)`` weighted by ``1/sqrt(rows of the source)`` so that one
large table does not outvote the others. The rows' arrays, weights and regimes live in
:mod:`boute.perf.rows`; this module maps parameters to rates and fits them. ``python -m boute.perf.fit``
re-fits on every in-scope row and writes ``boute/perf/data/fit.json``; ``boute.perf.validate`` re-fits
with sources or GPUs left out.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from boute.catalog import Catalog, builtin_catalog
from boute.perf.dataset import PublishedRow, in_scope_rows
from boute.perf.model import make_rates
from boute.perf.rows import (
    ARCHS,
    DTYPES,
    MEMORIES,
    OVERHEADS,
    SGLANG_OVERHEAD_FROM,
    SPEEDS,
    TRTLLM_RELEASES,
    RowTable,
    build_table,
    predict_rows,
)
from boute.perf.structure import LINK_FAMILIES, Families, FittedModel, Structure, logit, sigmoid

#: prior weights of the log engine speeds: each towards the reference (weak), each release towards the one
#: before it (a release rarely changes the kernels' speed by more than ~10-20%), and the newest release with
#: rows pinned at the reference
SPEED_LEVEL_PRIOR = 0.3
RELEASE_STEP_PRIOR = 2.0
REFERENCE_PIN = 100.0
#: parameter name -> (start value in fit space, prior weight towards the start)
START: dict[str, tuple[float, float]] = {
    **{f"c_{d}": (logit(v), 0.02) for d, v in zip(DTYPES, (0.65, 0.55, 0.45), strict=True)},
    **{f"arch_{a}": (0.0, 0.3) for a in ARCHS},
    **{f"ad_{a}_{d}": (0.0, 0.5) for a in ARCHS for d in DTYPES},
    "bw": (logit(0.8), 0.02),
    **{f"mem_{m}": (0.0, 0.3) for m in MEMORIES},
    **{f"bwarch_{a}": (0.0, 0.3) for a in ARCHS},
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
    **{f"speed_{k}": (0.0, SPEED_LEVEL_PRIOR) for k in SPEEDS},  # log speed of an engine or release
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
        bandwidth_arch_logit={a: v[f"bwarch_{a}"] for a in ARCHS},
    )


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def speeds(params: Mapping[str, float]) -> np.ndarray:
    """Every engine speed of :data:`SPEEDS` from fitted parameters (by name), then the reference (1), so a
    row's ``speed_idx`` (-1 for the reference) indexes it."""
    return np.exp(np.array([float(params[f"speed_{k}"]) for k in SPEEDS] + [0.0]))


def predict(table: RowTable, x: np.ndarray) -> np.ndarray:
    """The model's value for every row of ``table`` under parameters ``x`` (the rows' own units)."""
    v = dict(zip(NAMES, x, strict=True))
    st = structure_of(x)
    base = np.array([v[f"c_{d}"] for d in DTYPES])
    arch = np.array([v[f"arch_{a}"] for a in ARCHS] + [0.0])
    pair = np.array([[v[f"ad_{a}_{d}"] for d in DTYPES] for a in ARCHS] + [[0.0] * len(DTYPES)])
    mem = np.array([v[f"mem_{m}"] for m in MEMORIES] + [0.0])
    bwarch = np.array([v[f"bwarch_{a}"] for a in ARCHS] + [0.0])
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
        bandwidth=_sig(v["bw"] + mem[t.mem_idx] + bwarch[t.arch_idx]),
        link=link[t.link_idx],
        overhead_ms=oh[t.oh_idx],
        allreduce_latency_s=lat[t.link_idx],
        structure=st,
        seq_overhead_us=sq[t.oh_idx],
        ring_hop_latency_s=hop[t.link_idx],
        oneshot_max_bytes=t.oneshot_max_bytes,
        custom_max_bytes=t.custom_max_bytes,
        speed=speeds(v)[t.speed_idx],
    )
    return predict_rows(table, rates)


def x0() -> np.ndarray:
    return np.array([START[n][0] for n in NAMES])


def fit_table(table: RowTable, start: np.ndarray | None = None, *, max_nfev: int = 200) -> np.ndarray:
    """Least-squares parameters for ``table`` (weighted log residuals + priors towards :data:`START`)."""
    from scipy.optimize import least_squares  # heavy import kept off the CLI start-up path

    prior_x = x0()
    prior_w = np.array([START[n][1] for n in NAMES])
    chain = np.array([NAMES.index(f"speed_{k}") for k in TRTLLM_RELEASES])
    present = [k for k in TRTLLM_RELEASES if (table.speed_idx == SPEEDS.index(k)).any()]
    if present:
        prior_w[NAMES.index(f"speed_{present[-1]}")] = REFERENCE_PIN
    lo, hi = _bounds()
    s = np.clip(x0() if start is None else start, lo + 1e-9, hi - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict(table, x)
        pred = np.where(np.isfinite(pred) & (pred > 0), pred, 1e-9)
        steps = RELEASE_STEP_PRIOR * np.diff(x[chain])
        return np.concatenate([table.weight * np.log(pred / table.value), prior_w * (x - prior_x), steps])

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
