"""Calibration files (partial overrides, errors naming file+field) and the least-squares fit."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml

from boute.catalog import Efficiency, builtin_catalog
from boute.errors import SpecError
from boute.perf import (
    MeasuredPoint,
    apply_calibration,
    fit_efficiency,
    load_calibration,
    predict_point,
    replica_perf,
    save_calibration,
    scenario_catalog,
)
from boute.perf.structure import packaged_fit

CAT = builtin_catalog()


def test_partial_override_changes_only_named_factor(tmp_path: Path) -> None:
    f = tmp_path / "cal.yaml"
    f.write_text("gpus:\n  h100-sxm: {bandwidth: 0.5}\n")
    cat = apply_calibration(CAT, load_calibration(f))
    old, new = CAT.gpu("h100-sxm").efficiency, cat.gpu("h100-sxm").efficiency
    assert new.bandwidth == 0.5 and new.compute == old.compute and new.step_overhead_ms == old.step_overhead_ms
    assert cat.gpu("rtx-4090") == CAT.gpu("rtx-4090")
    m = CAT.model("llama-3.1-8b")
    slow, fast = replica_perf(m, cat.gpu("h100-sxm")), replica_perf(m, CAT.gpu("h100-sxm"))
    assert float(slow.decode_step_time(8, 8000)) > float(fast.decode_step_time(8, 8000))


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("gpus:\n  h100-sxm: {computee: 0.5}\n", "gpus.h100-sxm.computee", "unknown field"),
        ("gpus:\n  h100-sxm: {compute: 1.5}\n", "gpus.h100-sxm.compute", "less than or equal to 1"),
        ("gpus:\n  h100-sxm: {step_overhead_ms: -1}\n", "gpus.h100-sxm.step_overhead_ms", "greater than or equal"),
        ("gpus: [1, 2]\n", "gpus", "dictionary"),
        ("gpus: {h100-sxm: {compute: 0.5}\n", "line", "malformed YAML"),
    ],
)
def test_bad_calibration_file_names_file_and_field(tmp_path: Path, text: str, field: str, reason: str) -> None:
    f = tmp_path / "cal.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_calibration(f)
    msg = str(exc.value)
    assert "\n" not in msg and str(f) in msg and field in msg and reason in msg


def test_unknown_gpu_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "cal.json"
    f.write_text('{"gpus": {"h900": {"compute": 0.5}}}')
    with pytest.raises(SpecError, match=r"cal.json: gpus.h900: unknown GPU 'h900'"):
        apply_calibration(CAT, load_calibration(f))
    with pytest.raises(SpecError, match="file not found"):
        load_calibration(tmp_path / "missing.yaml")


def test_scenario_calibration_resolved_next_to_scenario(tmp_path: Path) -> None:
    from boute.specs import load_scenario

    base = yaml.safe_load((resources.files("boute.scenarios") / "paper-gsm8k.yaml").read_text())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cal.yaml").write_text("gpus:\n  rtx-5090: {compute: 0.3, link: 0.2}\n")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({**base, "calibration": "sub/cal.yaml"}))
    cat = scenario_catalog(load_scenario(tmp_path / "s.yaml"))
    assert cat.gpu("rtx-5090").efficiency.compute == 0.3 and cat.gpu("rtx-5090").efficiency.link == 0.2
    assert scenario_catalog(load_scenario(None)).gpu("rtx-5090") == CAT.gpu("rtx-5090")


def test_fit_recovers_known_factors(tmp_path: Path) -> None:
    truth = Efficiency(compute=0.5, bandwidth=0.7, link=0.7, step_overhead_ms=2.5)
    shapes = [("ttft_ms", 1, 128, 1), ("ttft_ms", 1, 2048, 1), ("tpot_ms", 8, 512, 64),
              ("output_tokens_per_s", 128, 256, 256), ("output_tokens_per_s", 32, 1024, 128)]  # fmt: skip
    points = []
    for metric, b, i, o in shapes:
        probe = MeasuredPoint("llama-3.1-8b", "rtx-pro-6000", metric, 1.0, batch=b, input_len=i, output_len=o)
        value = predict_point(probe, CAT, truth)
        points.append(MeasuredPoint("llama-3.1-8b", "rtx-pro-6000", metric, value, b, i, o))
    res = fit_efficiency(points, CAT, "rtx-pro-6000", prior_weight=0.0)
    assert set(res.fitted) == {"compute", "bandwidth", "step_overhead_ms"}
    assert res.efficiency.compute == pytest.approx(0.5, rel=0.03)
    assert res.efficiency.bandwidth == pytest.approx(0.7, rel=0.03)
    assert res.efficiency.step_overhead_ms == pytest.approx(2.5, rel=0.1)
    assert res.median_abs_error_pct < 0.5
    out = save_calibration(tmp_path / "fit.yaml", {"rtx-pro-6000": res.efficiency})
    cat = apply_calibration(CAT, load_calibration(out))
    assert cat.gpu("rtx-pro-6000").efficiency.compute == pytest.approx(res.efficiency.compute)


def test_packaged_efficiencies_are_the_family_fit() -> None:
    """gpus.yaml carries each GPU's family values of the fit in boute/perf/data/fit.json (python -m boute.perf.fit)."""
    fam = packaged_fit().families
    for gpu in CAT.gpus.values():
        expected = fam.efficiency_for(gpu)
        for name in ("compute", "compute_fp8", "compute_fp4", "bandwidth", "link", "step_overhead_ms"):
            assert getattr(gpu.efficiency, name) == pytest.approx(getattr(expected, name), abs=0.002), (gpu.name, name)


def test_calibration_file_still_overrides_the_fitted_family_value(tmp_path: Path) -> None:
    f = tmp_path / "cal.yaml"
    f.write_text("gpus:\n  rtx-pro-6000: {compute_fp4: 0.2}\n")
    cat = apply_calibration(CAT, load_calibration(f))
    m = CAT.model("llama-3.1-70b")
    slow = replica_perf(m, cat.gpu("rtx-pro-6000"), dtype="fp4")
    fast = replica_perf(m, CAT.gpu("rtx-pro-6000"), dtype="fp4")
    assert float(slow.prefill_time(4096)) > 1.5 * float(fast.prefill_time(4096))
