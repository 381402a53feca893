"""The shape of boute/optimize (docs/optimizer.md, "A map of boute/optimize/"): no import cycles, a public
surface that resolves and stays light, and a typed evaluation detail that reads the tracking DB's rows of
every version both ways."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from boute.optimize.evaluators.base import EvalDetail, EvalResult

PKG = Path(__file__).resolve().parents[1] / "boute" / "optimize"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The boute.optimize modules ``path`` imports anywhere (function bodies included), except under
    ``if TYPE_CHECKING:`` (annotations only, never run)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in modules:
                    out.add(sub)
                elif node.module in modules:
                    out.add(node.module)
    return out


def test_no_import_cycles_in_boute_optimize() -> None:
    files = sorted(PKG.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules) - {_module_name(f)} for f in files}
    # the graph is the real one (confirm and session both import what they share, as the map says)
    assert graph["boute.optimize.plan_run"] >= {"boute.optimize.session", "boute.optimize.confirm"}
    assert graph["boute.optimize.confirm"] >= {"boute.optimize.outcome", "boute.optimize.experiment"}
    assert graph["boute.optimize.session"] >= {"boute.optimize.outcome", "boute.optimize.experiment"}
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = path[path.index(n) :] + [n] if n in path else [m, n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_public_surface_resolves_and_importing_it_stays_light() -> None:
    import boute.optimize as opt

    for name in opt.__all__:
        assert getattr(opt, name) is not None, name
    with pytest.raises(AttributeError):
        _ = opt.no_such_export  # type: ignore[attr-defined]
    code = "import sys, boute.optimize; print(sorted(m for m in ('numpy', 'torch', 'scipy') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


# rows as the evaluators wrote them before EvalDetail existed (metrics["extra"] of the tracking DB)
FAST_ROW = {"tier_shares": [0.71, 0.29], "stable": True, "utilisation": [0.52, 0.8]}
SIM_ROW = {"tier_shares": [0.7, 0.3], "completed": 1790.0, "requests": 1800.0, "slo_attainment": 0.97}
LIVE_ROW = {
    "requests": 60,
    "failed": 0,
    "tier_shares": {"small": 0.75, "large": 0.25},
    "quality_stderr": 0.05,
    "answers_match_profile": 1.0,
    "speedup": 10.0,
    "deploy_s": 3.2,
    "replay_wall_s": 1.1,
}
CACHED_ROW = {**FAST_ROW, "cached": True}


@pytest.mark.parametrize("row", [FAST_ROW, SIM_ROW, LIVE_ROW, CACHED_ROW, {}])
def test_eval_detail_reads_and_writes_the_stored_format(row: dict) -> None:
    detail = EvalDetail.from_dict(json.loads(json.dumps(row)))
    assert detail.to_dict() == row  # what older versions wrote reads back, and is written again unchanged
    assert EvalDetail.from_dict(detail.to_dict()) == detail


def test_eval_detail_tells_predicted_from_measured_shares() -> None:
    fast, live = EvalDetail.from_dict(FAST_ROW), EvalDetail.from_dict(LIVE_ROW)
    assert fast.tier_shares == (0.71, 0.29) and fast.answered_shares is None and fast.utilisation == (0.52, 0.8)
    assert live.answered_shares == {"small": 0.75, "large": 0.25} and live.tier_shares is None
    assert live.failed == 0 and live.quality_stderr == 0.05 and not live.cached
    with pytest.raises(ValueError, match="exclusive"):
        EvalDetail(tier_shares=(1.0,), answered_shares={"small": 1.0})


def test_eval_result_round_trips_through_a_row() -> None:
    row = {
        "quality": 0.69,
        "p95_latency_s": 3.1,
        "throughput_rps": 88.0,
        "cost_per_hour": 28.2,
        "feasible": True,
        "wall_s": 0.2,
        "evaluator": "live",
        "p50_latency_s": 1.0,
        "mean_latency_s": 1.2,
        "capacity_rps": None,
        "thresholds": [0.4],
        "extra": LIVE_ROW,
    }
    res = EvalResult.from_dict(json.loads(json.dumps(row)))
    assert res.quality_se == 0.05 and res.thresholds == (0.4,) and res.extra.speedup == 10.0
    assert res.to_dict() == row
    assert EvalResult.from_dict({**row, "extra": FAST_ROW}).quality_se == 0.0
