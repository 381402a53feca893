"""The self-contained plan: written with its bundle, moved, opened, served; refused with one line when its
routing cannot be reproduced."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from boute.errors import SpecError
from boute.serving.bundle import bundle_dir, open_plan, plan_scenario, write_plan
from boute.specs import Plan, load_scenario

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "boute" / "data"

SCENARIO = """
name: own-hardware
cluster:
  gpus: {lab-gpu: 4, h100-sxm: 2}
  budget_per_hour: 20
tiers:
  - {name: small, model: lab-model, quality_model: mistralai/Mixtral-8x7B-Instruct-v0.1}
  - {name: large, model: llama-3.1-70b, quality_model: gpt-4-1106-preview}
quality: {profile: profile.csv}
workload: {arrivals: {kind: poisson}, rate_rps: 4, lengths: {source: profile}, duration_s: 10}
targets: {quality_floor: 0.6, p95_latency_s: 30}
calibration: cal.yaml
gpus:
  - {name: lab-gpu, tflops_bf16: 120, memory_gb: 48, bandwidth_gbs: 900, link_gbs: 32, price_per_hour: 0.6}
models:
  - {name: lab-model, params_b: 3, layers: 24, hidden: 3072, heads: 24, kv_heads: 8, head_dim: 128, ffn: 8192, vocab: 32000}
"""


def _user_scenario(folder: Path) -> Path:
    """A scenario with its own GPU and model, a profile file of its own and a calibration file."""
    folder.mkdir(parents=True, exist_ok=True)
    src = next(DATA.rglob("gsm8k_responses.csv"))
    shutil.copyfile(src, folder / "profile.csv")
    (folder / "cal.yaml").write_text("gpus:\n  lab-gpu: {compute: 0.5, bandwidth: 0.7}\n")
    (folder / "scenario.yaml").write_text(SCENARIO)
    return folder / "scenario.yaml"


def _plan(scorer: str = "length", **routing: object) -> Plan:
    return Plan.model_validate(
        {
            "routing": {"tiers": ["small", "large"], "fractions": [0.7, 0.3], "scorer": scorer, **routing}
            | {"reference": "profile.csv"},
            "deployment": [
                {"tier": "small", "model": "lab-model", "gpu": "lab-gpu", "count": 2},
                {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 2},
            ],
        }
    )


def test_a_plan_moved_with_its_bundle_opens_with_its_own_scenario(tmp_path: Path) -> None:
    sc = load_scenario(_user_scenario(tmp_path / "project"))
    out = write_plan(_plan(), tmp_path / "out" / "plan.json", sc)
    plan = open_plan(out)
    assert {Path(a.path).parts[0] for a in plan.artifacts} == {"plan.bundle"}  # profile and calibration
    assert len(plan.artifacts) == 2 and plan.routing.reference.startswith("plan.bundle/profile-")
    # moved: the project folder is gone, the plan and its bundle live elsewhere
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(out, moved / "plan.json")
    shutil.copytree(bundle_dir(out), bundle_dir(moved / "plan.json"))
    shutil.rmtree(tmp_path / "project")
    shutil.rmtree(tmp_path / "out")
    again = open_plan(moved / "plan.json")
    sc2 = plan_scenario(again, moved / "plan.json")
    assert sc2 is not None and "lab-gpu" in sc2.catalog.gpus
    assert sc2.resolve_path(sc2.quality.profile).is_file()
    from boute.perf import scenario_catalog

    assert scenario_catalog(sc2).gpu("lab-gpu").efficiency.compute == 0.5  # the calibration travelled too


def test_a_plan_without_its_bundle_or_with_a_changed_file_is_refused(tmp_path: Path) -> None:
    sc = load_scenario(_user_scenario(tmp_path / "p"))
    out = write_plan(_plan(), tmp_path / "plan.json", sc)
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(out, lonely / "plan.json")
    with pytest.raises(SpecError, match=r"artifacts\[0\]\.path: .*not found beside the plan"):
        open_plan(lonely / "plan.json")
    victim = tmp_path / json.loads(out.read_text())["artifacts"][1]["path"]
    victim.write_text(victim.read_text() + "\n# edited\n")
    with pytest.raises(SpecError, match=r"sha256: .*does not match"):
        open_plan(out)


@pytest.mark.timeout(120)  # starts processes
@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"thresholds": [0.5]}, "thresholds need routing.scorer"),
        ({}, "splitting load between tiers needs routing.scorer"),
        ({"scorer": "learned", "reference": "builtin:gsm8k"}, "needs routing.router"),
    ],
)
def test_routing_that_cannot_be_reproduced_is_refused_in_one_line(
    tmp_path: Path, routing: dict[str, object], message: str
) -> None:
    plan = {
        "routing": {"tiers": ["small", "large"], "fractions": [0.5, 0.5], **routing},
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090"},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "tp": 4},
        ],
    }
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    r = subprocess.run(
        [sys.executable, "-m", "boute", "validate", "--plan", str(f)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and message in lines[0], r.stderr


@pytest.mark.timeout(120)
def test_a_scenario_defined_gpu_deploys_and_serves_from_a_moved_plan(tmp_path: Path) -> None:
    """`boute serve --emulate` of a plan whose small tier runs on a GPU only its scenario defines, after the
    plan and its bundle moved away from the scenario's folder."""
    sc = load_scenario(_user_scenario(tmp_path / "project"))
    out = write_plan(_plan(), tmp_path / "out" / "plan.json", sc)
    shutil.rmtree(tmp_path / "project")
    from tests.services import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "boute", "serve", "--plan", str(out), "--emulate", "--speedup", "20"]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        registry = None
        for line in proc.stdout:
            if "registry " in line:
                registry = Path(line.rsplit("registry ", 1)[1].strip())
            if line.startswith("ready:"):
                break
        else:
            pytest.fail(f"boute serve exited with {proc.wait()}")
        assert registry is not None
        replicas = [b["url"] for b in json.loads(registry.read_text())]
        base = f"http://127.0.0.1:{port}"
        prompt = {"model": "boute", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        r = httpx.post(base + "/v1/chat/completions", json=prompt, timeout=30)
        assert r.status_code == 200 and r.headers["x-boute-tier"] == "small", r.text
        assert r.headers["x-boute-replica"].startswith("small-lab-gpu")
        metrics = httpx.get(base + "/metrics", timeout=5).text
        assert 'boute_plan_share{tier="small"} 0.7' in metrics
    finally:
        proc.terminate()  # SIGTERM, as a supervisor sends: everything stops
        proc.wait(timeout=60)
    for url in [f"http://127.0.0.1:{port}", *replicas]:  # nothing left listening, replicas included
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


@pytest.mark.slow
@pytest.mark.timeout(180)  # `deploy up` may wait its own --timeout 120 for the replicas, then `deploy down` runs
def test_a_learned_plan_on_own_hardware_deploys_and_its_gateway_gets_the_router_over_redis(
    tmp_path: Path, redis_url: str
) -> None:
    """`boute deploy up` copies the plan and its bundle into the deployment, times replicas with the
    scenario's own GPU, and publishes the bundle's files to Redis; the deployment's gateway, which never
    saw the plan's folder, loads the learned router from there and routes with it."""
    import uuid

    from boute.quality import quality_model_for
    from boute.quality.router import router_files
    from tests.services import free_port

    sc = load_scenario(_user_scenario(tmp_path / "project"))
    router = quality_model_for(sc).info["router_path"]
    plan = _plan("learned", router=router)
    out = write_plan(plan, tmp_path / "out" / "plan.json", sc, router_files(router))
    assert open_plan(out).routing.router.startswith("plan.bundle/router-")
    d, prefix, port = tmp_path / "deploy", f"test-bundle-{uuid.uuid4().hex[:8]}", free_port()
    argv = [sys.executable, "-m", "boute", "deploy", "up", str(out), "--emulate", "--speedup", "20", "--dir", str(d)]
    argv += ["--prefix", prefix, "--redis", redis_url, "--gateway-port", str(port), "--json", "--timeout", "120"]
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert any("lab-gpu" in rep["id"] for rep in st["replicas"])
        base = st["gateway_url"]
        hard = "A train leaves at 3:15 pm at 60 mph; another at 4:05 pm at 75 mph. " * 6 + "When do they meet?"
        seen = set()
        for prompt in ("hi", hard):
            body = {"model": "boute", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
            resp = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            assert resp.status_code == 200, resp.text
            seen.add(resp.headers["x-boute-tier"])
        assert "small" in seen
    finally:
        subprocess.run([sys.executable, "-m", "boute", "deploy", "down", "--dir", str(d)], check=False)
