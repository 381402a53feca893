"""The shipped Prometheus rules, through Prometheus' own tool: ``promtool check rules`` on the rule files and
``promtool test rules`` on tests/prometheus/*_test.yml (input series, expected recorded values and alerts)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from boute.observability import rule_paths

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (make test installs prometheus via apt)")
UNIT_TESTS = sorted((Path(__file__).parent / "prometheus").glob("*_test.yml"))


def _promtool(*args: str) -> str:
    assert PROMTOOL is not None
    out = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return text


def test_rule_files_are_valid() -> None:
    text = _promtool("check", "rules", *map(str, rule_paths()))
    assert text.count("SUCCESS") == len(rule_paths())


@pytest.mark.parametrize("unit", UNIT_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests_pass(unit: Path) -> None:
    text = _promtool("test", "rules", str(unit))
    assert "SUCCESS" in text and "FAILED" not in text


def test_the_unit_tests_cover_every_alert_and_rule() -> None:
    """An alert or recorded series no unit test names is one nobody checked."""
    import yaml

    names = {
        rule.get("alert") or rule["record"]
        for path in rule_paths()
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    }
    tested = "\n".join(p.read_text() for p in UNIT_TESTS)
    assert UNIT_TESTS and not {n for n in names if n not in tested}
