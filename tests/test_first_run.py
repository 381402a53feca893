"""The first run as fast as the second (issue 50 item 2): first-use builds timed and named on the search's
clock (boute/data/builds.py, the ``prepare`` phase), and built ahead by the install step
(``python -m boute.optimize.prepare``) under the very keys a search reads.

Each test gets its own cache folder (``BOUTE_CACHE_DIR``) seeded with the distilled static table from the
user's cache (distilled there first if missing, as the rest of the suite does): distilling it again would
take minutes, and every other build is what these tests watch. Timing claims live in
bench/bench_optimize_firstrun.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from boute.data import builds
from boute.optimize.clock import SearchClock, breakdown
from boute.optimize.prepare import prepared
from boute.quality import load_profile
from boute.scenarios import builtin_scenario_path
from boute.specs import Scenario, load_scenario
from boute.specs.io import read_mapping

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache but for the static table (copied from the user's), used by this process and children."""
    from boute.quality import build
    from boute.quality.static_embed import StaticSettings, load_static, static_dir

    load_static()  # the user's cache has it (distilled now if not)
    src = static_dir(StaticSettings())
    dest = tmp_path / "cache"
    shutil.copytree(src, static_dir(StaticSettings(), dest))
    monkeypatch.setenv("BOUTE_CACHE_DIR", str(dest))
    monkeypatch.setattr(build, "_MEMO", {})  # quality models are memoised per process: start from none
    return dest


def test_builds_are_timed_exclusively_and_only_inside_a_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(builds.time, "perf_counter", lambda: now[0])
    with builds.building("router"):  # no recording open: nothing is kept anywhere
        now[0] += 5.0
    with builds.recording() as seen:
        with builds.building("router"):
            now[0] += 1.0
            with builds.building("static"):  # nested: counted for itself, not for the router too
                now[0] += 60.0
            now[0] += 2.0
        with builds.building("tokens"):
            now[0] += 0.5
        with builds.recording() as inner, builds.building("verifier"):  # a nested recording keeps its own
            now[0] += 4.0
        with pytest.raises(RuntimeError), builds.building("router"):  # timed however it ends
            now[0] += 0.25
            raise RuntimeError("training failed")
    assert seen == {"static": 60.0, "router": 3.25, "tokens": 0.5}
    assert inner == {"verifier": 4.0}
    with pytest.raises(ValueError, match="unknown kind of build 'weights'"), builds.building("weights"):
        pass


def _small_scenario(dest: Path, n: int = 200) -> Scenario:
    """The built-in scenario on the first ``n`` GSM8K queries (a JSONL profile with their answers): the same
    builds as the built-in's, each a few times cheaper (the cascade verifier's fit, mostly)."""
    gsm8k = load_profile("builtin:gsm8k")
    lines = [
        {
            "prompt": gsm8k.prompts[i],
            "scores": {m: float(gsm8k.scores[i, j]) for j, m in enumerate(gsm8k.models)},
            "responses": {m: texts[i] for m, texts in gsm8k.responses.items()},
        }
        for i in range(n)
    ]
    (dest / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    spec = read_mapping(builtin_scenario_path("paper-gsm8k"))
    spec["quality"] = {"profile": "p.jsonl"}
    (dest / "s.yaml").write_text(yaml.safe_dump(spec))
    return load_scenario(dest / "s.yaml")


def test_the_prepare_phase_names_each_first_use_build_and_trains_a_cascades_judge(cache: Path, tmp_path: Path) -> None:
    sc = _small_scenario(tmp_path)
    first = SearchClock()
    prepared(first, "fast", sc, "preroute", 0)
    built = {k for k in first.seconds if k.startswith("prepare.")}
    assert built == {"prepare.router", "prepare.tokens"}  # the static table was there already
    shown = breakdown(first.seconds)
    assert shown.startswith("prepare ") and "(router " in shown and "tokens " in shown, shown
    # the cascade's judge is trained in the preparation, not inside the first evaluation
    cascade = SearchClock()
    ev = prepared(cascade, "fast", sc, "cascade", 0)
    assert [k for k in cascade.seconds if k.startswith("prepare.")] == ["prepare.verifier"]
    assert ev.quality_model is not None and ev.quality_model.cascade_scores is not None
    scores = ev.quality_model.cascade_scores()
    assert scores is ev.quality_model.cascade_scores() and not scores.flags.writeable  # computed once, shared
    assert {p.parent.name for p in cache.rglob("*.npz")} >= {"routers", "tokens", "verifiers"}


def _run(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BOUTE_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=110)


@pytest.mark.timeout(120)
def test_the_install_step_builds_once_what_a_search_then_only_reads(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from boute.optimize.prepare import main
    from boute.quality import build

    scenario = str(_small_scenario(tmp_path).source)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\n")
    # a scenario that cannot be prepared is reported and the others still are; the step exits 0
    assert main(["--scenario", str(bad), "--scenario", scenario, "--mode", "preroute", "--json"]) == 0
    skipped, done = json.loads(capsys.readouterr().out)["prepared"]
    assert skipped["skipped"].startswith(f"{bad}: ") and "cluster" in skipped["skipped"], skipped
    assert set(done["built"]) == {"router", "tokens"} and done["failed"] is None and done["skipped"] is None
    monkeypatch.setattr(build, "_MEMO", {})
    assert main(["--scenario", scenario, "--mode", "preroute"]) == 0  # idempotent: everything is read back
    again = capsys.readouterr().out
    assert again.startswith(f"{scenario} (preroute): ") and "built: nothing, all cached" in again, again
    search = _run(
        ["-m", "boute", "optimize", "-s", scenario, "--evaluator", "fast", "--strategy", "random", "--max-evals", "4"]
        + ["-q", "--out", str(tmp_path / "plan.json"), "--db", f"sqlite:///{tmp_path / 'b.db'}"],
        cache,
        tmp_path,
    )
    assert search.returncode == 0, search.stderr
    shown = next(ln.strip() for ln in search.stdout.splitlines() if ln.strip().startswith("time:"))
    # a fresh process: it prepared its evaluator (a phase of its own) and built nothing, no sub-phase: the
    # install step's entries are the very keys a search reads
    assert re.match(r"time: prepare [\d.]+ s, ", shown), shown
    tables = [p.name for p in (cache / "routers").iterdir() if p.suffix == ".npy"]
    assert len(tables) == 1, tables  # the routers share one table
