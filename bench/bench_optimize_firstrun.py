"""The first ``boute optimize`` of a fresh clone against the second (issue 50 item 2: within 1.5x).

What a newcomer meets: a fresh clone, ``make install``, then the default search. Each round, measured in
fresh interpreters (``sys.executable``, this environment: the venv ``make install`` made, its BoTorch kernel
built):

1. a fresh clone: the project's tracked (and untracked, not ignored) files copied into an empty folder, so no
   ``__pycache__`` and nothing else the working tree built comes along; a fresh, empty ``BOUTE_CACHE_DIR``;
2. the install step (:data:`INSTALL_STEPS`, what ``make install`` runs after pip and the kernel: the
   byte-compile and ``python -m boute.optimize.prepare``), timed on its own: ``install_s``;
3. the first run, then the second, of the issue's command (:data:`COMMAND`: the built-in scenario, a new
   tracking DB each, so the second one searches rather than resumes), each timed as the process's wall
   (interpreter start to exit: what the user waits for) with the summary's phases beside it.

``first_over_second`` is each round's ratio of walls (goal <= 1.5), ``first_over_second_cpu`` of CPU seconds
(the process's and its pool workers', which a busy machine stretches less than the wall); the mins and
medians over rounds are beside the
issue's goals (the built-in <= 10 s warm and <= 15 s first, on 2 cores). ``no_install`` (full runs only): one
first run on an empty cache without the install step, which is what a first run cost before it existed (the
static table distilled inside the search).

Quick (a check that the script works, not a figure): one round, the install step for the default scenario
only, and the static table copied from the user's cache when it has one instead of distilled (the result
says so). The load average is recorded before and after: on a shared machine the figures move with it.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: what ``make install`` runs after pip and the BoTorch kernel (the Makefile's ``warm`` recipe), in the clone
INSTALL_STEPS: tuple[tuple[str, ...], ...] = (
    ("-m", "compileall", "-q", "boute", "router", "backends"),
    (
        "-m",
        "boute.optimize.prepare",
    ),
)
#: the issue's command (the built-in scenario, the default search), with the DB named per run
COMMAND = ("-m", "boute", "optimize", "-q", "--out", "{dir}/plan.json", "--db", "sqlite:///{dir}/boute.db")
GOALS = {"first_over_second": 1.5, "warm_s": 10.0, "first_s": 15.0}


def _clone(dest: Path) -> None:
    """The project's files as a fresh clone has them: tracked plus untracked-not-ignored (the work in progress)."""
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        src = ROOT / raw.decode()
        if src.is_file():  # a tracked file deleted in the working tree is not there
            (dest / raw.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / raw.decode())


def _env(clone: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "BOUTE_CACHE_DIR")}
    env |= {"PYTHONPATH": str(clone), "BOUTE_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def _timed(args: tuple[str, ...], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and the workers it waited for, its output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return wall, cpu, done.stdout + done.stderr


def _phases(out: str) -> dict[str, Any]:
    """The summary's ``time:`` line as ``{phase: seconds}`` (sub-phases as ``phase.sub``) and the plan's P95."""
    line = next((ln for ln in out.splitlines() if ln.strip().startswith("time:")), "")
    phases: dict[str, Any] = {}
    for top, secs, inner in re.findall(r"(\w+) ([\d.]+) s(?: \(([^)]*)\))?", line):
        phases[top] = float(secs)
        for sub, v in re.findall(r"(\w+) ([\d.]+)", inner or ""):
            phases[f"{top}.{sub}"] = float(v)
    p95 = re.search(r"P95 ([\d.]+) s", out)
    return {"phases": phases, "p95_s": float(p95.group(1)) if p95 else None}


def _search(clone: Path, env: dict[str, str], tag: str) -> dict[str, Any]:
    d = clone / "runs" / tag
    d.mkdir(parents=True)
    wall, cpu, out = _timed(tuple(a.format(dir=d) for a in COMMAND), clone, env)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), **_phases(out)}


def _round(quick: bool, with_install: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="boute-firstrun-") as tmp:
        clone, cache = Path(tmp) / "clone", Path(tmp) / "cache"
        clone.mkdir()
        cache.mkdir()
        _clone(clone)
        env = _env(clone, cache)
        out: dict[str, Any] = {}
        where = subprocess.run(
            [sys.executable, "-c", "import boute; print(boute.__file__)"], env=env, cwd=clone, capture_output=True
        )
        if not where.stdout.decode().startswith(str(clone)):
            raise RuntimeError(f"the clone's boute is not the one imported: {where.stdout.decode().strip()}")
        if with_install:
            steps = INSTALL_STEPS
            if quick:
                steps = (
                    *INSTALL_STEPS[:-1],
                    (*INSTALL_STEPS[-1], "--scenario", "builtin:paper-gsm8k", "--mode", "preroute"),
                )
                out["quick_static_copied"] = _copy_static(cache)
            t0, cpu = time.perf_counter(), 0.0
            for step in steps:
                cpu += _timed(step, clone, env)[1]
            out["install_s"], out["install_cpu_s"] = round(time.perf_counter() - t0, 2), round(cpu, 2)
        out["first"] = _search(clone, env, "first")
        if with_install:
            out["second"] = _search(clone, env, "second")
            out["first_over_second"] = round(out["first"]["wall_s"] / out["second"]["wall_s"], 3)
            out["first_over_second_cpu"] = round(out["first"]["cpu_s"] / out["second"]["cpu_s"], 3)
        return out


def _copy_static(cache: Path) -> bool:
    """Quick runs: the user's distilled table, when there is one, instead of a distillation (minutes)."""
    from boute.data import cache_dir

    src = Path(os.environ.get("BOUTE_CACHE_DIR") or cache_dir()) / "static"
    if not src.is_dir():
        return False
    shutil.copytree(src, cache / "static")
    return True


def run(quick: bool = True) -> dict[str, Any]:
    rounds = 1 if quick else 3
    load_before = os.getloadavg()
    runs = [_round(quick) for _ in range(rounds)]
    first = [r["first"]["wall_s"] for r in runs]
    second = [r["second"]["wall_s"] for r in runs]
    out: dict[str, Any] = {
        "command": "python " + " ".join(COMMAND),
        "install_steps": ["python " + " ".join(s) for s in INSTALL_STEPS],
        "rounds": runs,
        "install_s_min": min(r["install_s"] for r in runs),
        "first_s_min": min(first),
        "second_s_min": min(second),
        "first_s_median": float(np.median(first)),
        "second_s_median": float(np.median(second)),
        "first_over_second_of_mins": round(min(first) / min(second), 3),
        "first_over_second_median": float(np.median([r["first_over_second"] for r in runs])),
        "first_over_second_cpu_median": float(np.median([r["first_over_second_cpu"] for r in runs])),
        "goals": GOALS,
    }
    if not quick:
        out["no_install"] = _round(quick, with_install=False)["first"]
    out["load_avg_before"] = [round(v, 2) for v in load_before]
    out["load_avg_after"] = [round(v, 2) for v in os.getloadavg()]
    return out
