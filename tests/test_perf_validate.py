"""Held-out validation of the performance model, kept as a regression bound.

``boute/perf/data/validation.json`` is written by ``python -m boute.perf.validate`` (a few minutes: one
full re-fit per held-out source and per held-out GPU). It stores each fold's fitted parameters, so these
tests replay every held-out prediction with the current code in milliseconds: a change to the physics or
the serving regimes that moves the held-out error shows up here without re-fitting.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from boute.perf.dataset import VERSION_1_LAST_ID
from boute.perf.fit import NAMES, fit_table
from boute.perf.rows import build_table
from boute.perf.validate import REPORT_PATH, replay, summarize

REPORT = json.loads(REPORT_PATH.read_text())
SPLITS = {"source": "leave_one_source_out", "gpu": "leave_one_gpu_out"}


def test_report_matches_the_current_parameterisation() -> None:
    assert REPORT["parameter_names"] == list(NAMES), "re-run python -m boute.perf.validate"
    assert REPORT["dataset"]["sources"] >= 8 and len(REPORT["dataset"]["gpu_types"]) >= 8


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_replayed_held_out_errors_match_the_report(split: str) -> None:
    held = replay(split, REPORT["fold_params"][split])
    assert np.isfinite(held.error_pct).all()
    now, stored = summarize(held), REPORT[SPLITS[split]]
    assert now["all"]["median_abs_pct"] == pytest.approx(stored["all"]["median_abs_pct"], abs=0.2)
    assert now["all"]["p90_abs_pct"] == pytest.approx(stored["all"]["p90_abs_pct"], abs=0.3)


def test_leave_one_source_out_bounds() -> None:
    """Regression bounds at today's figures (the issue's goal: median <= 10%, p90 <= 25%, per metric and GPU
    family: met for each). Blackwell's p90 was 50.5% while its only PP 4-8 rows came from v1.0; release/1.2's
    PP rows and the B200 tables (dataset version 4) brought it under."""
    held = replay("source", REPORT["fold_params"]["source"])
    s = summarize(held)
    assert s["all"]["median_abs_pct"] <= 7.5 and s["all"]["p90_abs_pct"] <= 22.5  # 7.8% / 23.5% before speeds
    assert s["metric"]["output_tokens_per_s"]["median_abs_pct"] <= 7.5
    assert s["metric"]["output_tokens_per_s"]["p90_abs_pct"] <= 24.0  # 27.7% before the release speeds
    for metric in ("ttft_ms", "tpot_ms"):  # 110 and 52 rows before dataset v3, now ~2,000 each
        assert s["metric"][metric]["median_abs_pct"] <= 8.0 and s["metric"][metric]["p90_abs_pct"] <= 23.0, metric
    for fam, bound in (("hopper", 7.5), ("ampere", 7.0), ("ada", 9.0), ("blackwell", 10.0)):
        assert s["gpu_family"][fam]["median_abs_pct"] <= bound, fam
    for fam, bound in (("hopper", 22.5), ("ampere", 20.5), ("ada", 25.0), ("blackwell", 23.0)):
        assert s["gpu_family"][fam]["p90_abs_pct"] <= bound, fam
    # the rows of dataset version 1, held out the same way: 9.5% / 30.6% before this structure
    first = np.array([r.id <= VERSION_1_LAST_ID for r in held.rows])
    err = np.abs(held.error_pct[first])
    assert np.median(err) <= 7.5 and np.percentile(err, 90) <= 21.5


def test_leave_one_gpu_out_bounds() -> None:
    s = summarize(replay("gpu", REPORT["fold_params"]["gpu"]))
    assert s["all"]["median_abs_pct"] <= 9.5 and s["all"]["p90_abs_pct"] <= 25.0
    for gpu in ("h100-sxm", "h200-sxm", "gh200", "l40s", "l40"):
        assert s["gpu"][gpu]["median_abs_pct"] <= 15.0, gpu
    # the H200 keeps its own bandwidth efficiency next to the B200 (same HBM3e): 17.2% when they shared one
    assert s["gpu"]["h200-sxm"]["median_abs_pct"] <= 8.0
    # a new generation held out: without its rows the B200 comes out ~30% fast (its FP4 70B tables run far
    # below the roofline the other GPUs fit); bound kept so that it does not grow unnoticed
    assert s["gpu"]["b200"]["median_abs_pct"] <= 35.0
    # the RTX 4090's 7 rows are vLLM's only rows: held out, vLLM runs at the reference speed (the newest
    # TensorRT-LLM release), ~15% faster than the speed those rows give vLLM in sample
    assert s["gpu"]["rtx-4090"]["median_abs_pct"] <= 21.0


def test_worst_rows_come_with_a_reason() -> None:
    for split in SPLITS.values():
        assert all(w["why"] and w["source"] for w in REPORT[split]["worst_rows"])


@pytest.mark.timeout(120)  # starts processes
def test_cli_prints_the_stored_report() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "boute.cli.main", "perf", "validate", "--stored", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["leave_one_source_out"]["all"] == REPORT["leave_one_source_out"]["all"]


@pytest.mark.slow
def test_one_fold_refits_to_the_stored_parameters() -> None:
    """Re-fit the smallest leave-one-source-out fold from its stored parameters: they are an optimum of this
    code's objective, so the fit stays there (a change to the physics, the priors or the rows moves it).
    From the neutral start the same fit takes ~80 s; from the stored point a few iterations."""
    from boute.perf.dataset import in_scope_rows

    rows = in_scope_rows()
    table = build_table(rows)
    keep = np.array([r.source_id != "mushfiqrahman-4090" for r in rows])
    stored = np.asarray(REPORT["fold_params"]["source"]["mushfiqrahman-4090"])
    x = fit_table(table.subset(keep), start=stored)
    held = table.subset(~keep)
    from boute.perf.fit import predict

    assert np.allclose(predict(held, x), predict(held, stored), rtol=0.02)
    # ... and the fold's own rows as well: the whole fitted model, not only the held-out prediction
    assert np.allclose(predict(table.subset(keep), x), predict(table.subset(keep), stored), rtol=0.02)


def test_the_other_sources_lookup_predicts_each_row_from_the_same_configuration_elsewhere() -> None:
    """Two releases measuring one configuration predict each other; a row measured once has no lookup; and
    the packaged report carries the lookup next to the model on the same rows."""
    import dataclasses

    from boute.perf.dataset import in_scope_rows
    from boute.perf.validate import other_sources_lookup

    base = next(r for r in in_scope_rows() if r.source_id == "trtllm-v0.15")
    a = dataclasses.replace(base, id=1, value=100.0)
    b = dataclasses.replace(base, id=2, source_id="trtllm-v0.17", value=125.0)
    c = dataclasses.replace(base, id=3, source_id="trtllm-v0.17", value=80.0)  # same source as b: averaged
    lone = dataclasses.replace(base, id=4, input_len=base.input_len + 1, value=50.0)
    held = other_sources_lookup([a, b, c, lone])
    assert held.predicted[0] == pytest.approx(100.0)  # sqrt(125 x 80): b and c never predict each other
    assert held.predicted[1] == pytest.approx(100.0) and held.error_pct[1] == pytest.approx(-20.0)
    assert np.isnan(held.predicted[3])
    stored = REPORT["other_sources_lookup"]
    assert stored["lookup"]["rows"] == stored["model_held_out"]["rows"] > 1000


def test_a_release_without_rows_takes_its_neighbours_speed() -> None:
    """The speed chain: two releases' rows, the release between them held out. It lands between its
    neighbours (the random-walk prior), the newest release with rows is the reference (speed 1), and BOute's
    SGLang runs at the reference."""
    import dataclasses

    from boute.perf.dataset import in_scope_rows
    from boute.perf.fit import predict
    from boute.perf.rows import SPEEDS, speed_of

    rows_of = {
        s: [r for r in in_scope_rows() if r.source_id == s and r.tp == 1][:40] for s in ("trtllm-v0.12", "trtllm-v0.14")
    }
    pick = rows_of["trtllm-v0.12"] + rows_of["trtllm-v0.14"]
    assert {r.source_id for r in pick} == {"trtllm-v0.12", "trtllm-v0.14"}
    # v0.14 runs its kernels 20% faster than the same rows say of v0.12
    rows = [dataclasses.replace(r, value=r.value * (1.2 if r.source_id == "trtllm-v0.14" else 1.0)) for r in pick]
    x = dict(zip(NAMES, fit_table(build_table(rows), max_nfev=40), strict=True))
    v12, v13, v14 = (x[f"speed_{k}"] for k in ("0.12.0", "0.13.0", "0.14.0"))
    assert v14 == pytest.approx(0.0, abs=0.01)  # the reference
    assert v12 < v13 < v14 and v12 == pytest.approx(-np.log(1.2), abs=0.08)
    sglang = dataclasses.replace(pick[0], engine="sglang", engine_version="0.4")
    assert speed_of(sglang) == -1
    xv = np.array(list(x.values()))
    faster = xv + np.array([0.3 if n.startswith("speed_") else 0.0 for n in NAMES])
    assert predict(build_table([sglang]), faster)[0] == predict(build_table([sglang]), xv)[0]
    assert predict(build_table([pick[0]]), faster)[0] > predict(build_table([pick[0]]), xv)[0]
    with pytest.raises(ValueError, match="0.99"):
        speed_of(dataclasses.replace(pick[0], engine_version="0.99"))
    assert SPEEDS[speed_of(pick[0])] in ("0.12.0", "0.14.0")
