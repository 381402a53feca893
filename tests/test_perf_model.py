"""The analytical replica model: published rows, memory accounting, infeasibility, monotonicity."""

from __future__ import annotations

import numpy as np
import pytest

from boute.catalog import builtin_catalog
from boute.perf import predict_point, replica_perf
from boute.perf.dataset import in_scope_rows
from boute.perf.engines import ENGINES
from boute.perf.fit import build_table, params_of, predict
from boute.perf.measurements import HELD_OUT, REFERENCE, compare
from boute.perf.structure import packaged_fit

CAT = builtin_catalog()
#: the worst measurements.md row reached by the shared-parameter fit is ~10%; a row drifting past this fails
ROW_TOLERANCE_PCT = 15.0


@pytest.mark.parametrize(
    "point", REFERENCE, ids=lambda p: f"{p.model}-{p.gpu}-tp{p.tp}-{p.metric}-{p.batch}x{p.input_len}"
)
def test_every_measurements_row_within_tolerance(point) -> None:
    perf = replica_perf(CAT.model(point.model), CAT.gpu(point.gpu), point.tp, point.pp, point.dtype, point.mem_fraction)
    assert perf.fits, perf.reason
    assert perf.max_batch(point.input_len, point.output_len) >= point.batch  # the published batch fits
    err = 100 * (predict_point(point, CAT) - point.value) / point.value
    assert abs(err) <= ROW_TOLERANCE_PCT


def test_measurements_md_medians() -> None:
    ref = np.median([abs(r["error_pct"]) for r in compare(REFERENCE)])
    held = np.median([abs(r["error_pct"]) for r in compare(HELD_OUT)])
    assert ref < 5.0 and held < 10.0
    assert len(REFERENCE) == 11 and len(HELD_OUT) == 18


def test_packaged_fit_on_the_dataset_in_sample() -> None:
    """The packaged parameters reproduce the in-scope rows they were fitted on (regression bound)."""
    rows = in_scope_rows()
    table = build_table(rows)
    err = 100 * (predict(table, params_of(packaged_fit())) / table.value - 1)
    assert np.isfinite(err).all()
    assert np.median(np.abs(err)) < 8.0 and np.percentile(np.abs(err), 90) < 25.0


def test_engine_terms_have_physical_signs() -> None:
    """Older static engines read GQA KV per query head; mixed-prefill engines fold prompts into steps."""
    m, g = CAT.model("llama-3.1-70b"), CAT.gpu("h100-sxm")
    old = replica_perf(m, g, tp=4, engine=ENGINES["trtllm-static"])
    new = replica_perf(m, g, tp=4, engine=ENGINES["trtllm"])
    assert float(old.shape.kv_bytes_per_token) == pytest.approx(8 * float(new.shape.kv_bytes_per_token))
    assert float(old.decode_step_time(64, 64 * 2048)) > float(new.decode_step_time(64, 64 * 2048))
    fit = packaged_fit().structure
    assert 1.0 <= fit.roofline_p < 20 and 0 < fit.moe_efficiency <= 1 and 0 <= fit.pp_serial < 1
    assert fit.engine_overhead_ms["sglang"] == fit.engine_overhead_ms["trtllm"]  # no SGLang rows: tied


def test_moe_memory_counts_total_compute_counts_active() -> None:
    mix = CAT.model("mixtral-8x7b")
    dense_like = mix.model_copy(update={"num_experts": 1, "experts_per_token": 1, "active_params_b": None,
                                        "params_b": 12.9})  # fmt: skip
    gpu = CAT.gpu("h100-sxm")
    moe, dense = replica_perf(mix, gpu, tp=2), replica_perf(dense_like, gpu, tp=2)
    assert moe.weights_gb_per_gpu == pytest.approx(46.7 * 2 / 2)
    assert dense.weights_gb_per_gpu == pytest.approx(12.9 * 2 / 2)
    # a long compute-bound prefill costs the FLOPs of a dense 12.9B model, its routed-expert GEMMs at the
    # fitted grouped-GEMM efficiency (< 1): slower than dense, by at most 1 / moe_efficiency
    big = 16384
    t_moe, t_dense = float(moe.prefill_time(big, big * 512)), float(dense.prefill_time(big, big * 512))
    assert t_dense < t_moe < t_dense / packaged_fit().structure.moe_efficiency * 1.1
    # batch-1 decode reads only the 2 routed experts, a full batch reads all 8 (memory-bound)
    assert float(moe.decode_step_time(1, 512)) < float(moe.decode_step_time(256, 256 * 512)) / 2


def test_infeasible_configs_reported() -> None:
    big = replica_perf(CAT.model("llama-3.1-70b"), CAT.gpu("rtx-4090"), tp=1, dtype="bf16")
    assert not big.fits and "weights need" in big.reason and big.max_batch(128, 128) == 0
    assert big.static_batch(8, 128, 128)["batch"] == 0
    bad_tp = replica_perf(CAT.model("llama-3.1-8b"), CAT.gpu("h100-sxm"), tp=3)
    assert not bad_tp.fits and "does not divide 32 attention heads" in bad_tp.reason
    no_fp8 = replica_perf(CAT.model("llama-3.1-8b"), CAT.gpu("a100-80gb"), dtype="fp8")
    assert not no_fp8.fits and "no FP8" in no_fp8.reason
    too_many = replica_perf(CAT.model("llama-3.1-70b"), CAT.gpu("h100-sxm"), tp=8, pp=2)
    assert not too_many.fits and "GPUs per node" in too_many.reason


def test_more_tp_less_weight_more_kv() -> None:
    m, g = CAT.model("llama-3.1-70b"), CAT.gpu("h100-sxm")
    perfs = [replica_perf(m, g, tp=tp) for tp in (2, 4, 8)]
    assert all(p.fits for p in perfs)
    w = [p.weights_gb_per_gpu for p in perfs]
    kv = [p.kv_capacity_tokens for p in perfs]
    assert w[0] > w[1] > w[2] and kv[0] < kv[1] < kv[2]
    # pipeline stages split weights the same way
    assert replica_perf(m, g, tp=2, pp=2).weights_gb_per_gpu == pytest.approx(w[1])


@pytest.mark.parametrize("gpu", ["h100-sxm", "l40s", "rtx-4090", "rtx-pro-6000"])
def test_fp8_faster_than_bf16(gpu: str) -> None:
    m = CAT.model("llama-3.1-8b")
    bf, f8 = replica_perf(m, CAT.gpu(gpu), dtype="bf16"), replica_perf(m, CAT.gpu(gpu), dtype="fp8")
    assert f8.fits and bf.fits
    assert float(f8.prefill_time(4096)) < float(bf.prefill_time(4096))
    assert float(f8.decode_step_time(32, 32 * 1024)) < float(bf.decode_step_time(32, 32 * 1024))
    assert f8.kv_capacity_tokens > bf.kv_capacity_tokens


def test_decode_vectorised_and_monotone() -> None:
    perf = replica_perf(CAT.model("llama-3.1-8b"), CAT.gpu("h100-sxm"))
    batch = np.array([0, 1, 8, 64, 256])
    t = perf.decode_step_time(batch, batch * 1000)
    assert t.shape == (5,) and t[0] == 0.0 and np.all(np.diff(t[1:]) > 0)
    ctx = perf.decode_step_time(16, np.array([1e3, 1e4, 1e5]))
    assert np.all(np.diff(ctx) > 0)
    # TP shortens a step; PP does not (stages run in turn) but adds hand-offs
    m70, g = CAT.model("llama-3.1-70b"), CAT.gpu("h100-sxm")
    tp2, tp4 = replica_perf(m70, g, tp=2), replica_perf(m70, g, tp=4)
    assert float(tp4.decode_step_time(32, 32 * 512)) < float(tp2.decode_step_time(32, 32 * 512))
    assert (
        float(replica_perf(m70, g, tp=2, pp=2).decode_step_time(32, 32 * 512))
        > float(tp2.decode_step_time(32, 32 * 512)) * 0.9
    )
