"""What the route reason costs the gateway (issue 52 item 4: under 5 µs of CPU per request).

Load-robust measurements only (req/s on this shared host follows the other tenants):

1. **Instructions per request, before vs after** (callgrind, when valgrind and a C compiler are there).
   ``bench/route_reason_child.py`` runs one gateway in its own process and serves GSM8K chat completions from
   bytes (``Gateway.serve``, then the fast path's own framing, ``GatewayHttpProtocol._write``, into a transport
   that drops the bytes), 16 at a time, in front of two emulated replicas (one process, speedup 1000, 4-token
   answers). Under ``valgrind --tool=callgrind --instr-atstart=no`` it counts instructions over the measured
   requests only (start-up and warm-up excluded, through callgrind's client requests in a tiny library compiled
   here). Instruction counts do not depend on what else the host runs; they vary a little with timing (how many
   event-loop turns the answers take), so each tree is counted ``rounds`` times. Converted to µs with the
   gateway's own instructions per µs (the after tree's instructions per request over its CPU per request, 2).
2. **CPU per request, before vs after**: the same child without valgrind, ``time.process_time`` over batches
   of requests, divided by them; the minimum over a round's batches, rounds interleaved (base first in even
   rounds). On a loaded host its spread (tens of µs between rounds at load average 9) is larger than the reason
   costs: it is recorded as a sanity check, the instruction counts are the figure.
3. **Microbenchmarks of the added work** (``timeit``, minimum of 7 repeats): formatting a pre-route reason
   into its compiled template, a cascade's, and framing one more header the way the fast path frames each
   (value check, format, encode).

The plan pre-routes by prompt length (the ~1 µs scorer), so the reason is as large a part of a request as it
gets. "Before" is ``router/`` and ``boute/`` of the commit before the one that added
``boute/serving/reason.py`` (``git archive``), or ``BOUTE_BENCH_BASE_TREE=DIR``.
``python -m bench route_reason [--quick]`` writes ``bench/results/route_reason.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "bench" / "route_reason_child.py"
GOAL_US = 5.0
CG_SOURCE = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("measured"); }
"""


def _base_tree(work: Path) -> tuple[Path, str]:
    """``router/`` and ``boute/`` as they were before the route reason (or ``BOUTE_BENCH_BASE_TREE``)."""
    given = os.environ.get("BOUTE_BENCH_BASE_TREE")
    if given:
        return Path(given), f"BOUTE_BENCH_BASE_TREE={given}"
    git = ["git", "-C", str(ROOT)]
    log = [*git, "log", "--diff-filter=A", "--format=%H", "--", "boute/serving/reason.py"]
    added = subprocess.run(log, capture_output=True, text=True, check=True).stdout.split()
    rev = f"{added[-1]}^" if added else "HEAD"  # not committed yet: HEAD is the tree before it
    sha = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True, check=True).stdout.strip()
    tree = work / "base"
    tree.mkdir()
    archive = subprocess.run([*git, "archive", sha, "router", "boute"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree, sha


def _child(tree: Path, spec: Path, callgrind: Path | None = None) -> dict[str, Any]:
    """One gateway run on ``tree``'s code; under callgrind (``callgrind``: its client-request library) the result
    also holds ``instructions``, counted over the measured requests."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    cmd = [sys.executable, str(CHILD), str(spec)]
    out_file = None
    if callgrind is not None:
        env["BOUTE_BENCH_CALLGRIND_LIB"] = str(callgrind)
        out_file = spec.parent / f"callgrind.{tree.name}.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}", *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child on {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if out_file is not None:
        dump = next(out_file.parent.glob(out_file.name + ".*"))  # the dump cg_stop wrote (part 1)
        got["instructions"] = int(re.search(r"^totals: (\d+)", dump.read_text(), re.M).group(1))  # type: ignore[union-attr]
        for f in out_file.parent.glob(out_file.name + "*"):
            f.unlink()
    return got


def _spec(work: Path, stack_backends: list[dict[str, Any]], plan: dict[str, Any], **run: int) -> Path:
    from boute.quality import load_profile

    prompts = load_profile("builtin:gsm8k").prompts[:256]
    bodies = [
        json.dumps({"model": "boute", "messages": [{"role": "user", "content": p}], "max_tokens": 4}) for p in prompts
    ]
    path = work / f"spec-{run['requests']}x{run['batches']}.json"
    path.write_text(json.dumps({"plan": plan, "backends": stack_backends, "bodies": bodies, "concurrency": 16} | run))
    return path


def _cpu(trees: dict[str, Path], spec: Path, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in trees}
    load: list[float] = []
    for r in range(rounds):
        order = list(trees.items())
        for name, tree in order if r % 2 == 0 else order[::-1]:
            load.append(round(os.getloadavg()[0], 2))
            runs[name].append(min(_child(tree, spec)["cpu_us_per_request"]))
    paired = [a - b for a, b in zip(runs["after"], runs["before"], strict=True)]
    return {
        "round_mins_us": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "min_us": {k: round(min(v), 2) for k, v in runs.items()},
        "added_us_per_round": [round(d, 2) for d in paired],
        "added_us_median_of_rounds": round(float(np.median(paired)), 2),
        "load_avg_1min": load,
    }


def _instructions(trees: dict[str, Path], spec: Path, work: Path, rounds: int, requests: int) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        return {"skipped": "valgrind or a C compiler is missing"}
    src = work / "cg.c"
    src.write_text(CG_SOURCE)
    lib = work / "libcg.so"
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True)
    if built.returncode != 0:
        return {"skipped": f"could not build the callgrind helper (valgrind headers?): {built.stderr.strip()[-200:]}"}
    per_request: dict[str, list[float]] = {name: [] for name in trees}
    headers: dict[str, Any] = {}
    for r in range(rounds):
        order = list(trees.items())
        for name, tree in order if r % 2 == 0 else order[::-1]:
            got = _child(tree, spec, lib)
            per_request[name].append(got["instructions"] / requests)
            headers[name] = got["headers"]
    before, after = (float(np.median(per_request[k])) for k in ("before", "after"))
    return {
        "instructions_per_request": {k: [round(x) for x in v] for k, v in per_request.items()},
        "added_instructions_per_request": round(after - before),
        "headers": headers,
    }


def _in_process(quick: bool) -> dict[str, Any]:
    from tests.stack import TEST_PLAN, Stack

    plan = {**TEST_PLAN, "deployment": [TEST_PLAN["deployment"][0], TEST_PLAN["deployment"][2]]}
    cpu_rounds, batches, requests = (2, 5, 1000) if quick else (6, 8, 2000)
    cg_rounds, cg_requests = (1, 300) if quick else (3, 1000)
    st = Stack.start(plan, speedup=1000, one_process=True)
    try:
        assert st.backends_file is not None
        backends = json.loads(st.backends_file.read_text())
        with tempfile.TemporaryDirectory(prefix="boute-bench-reason-") as tmp:
            work = Path(tmp)
            base, base_rev = _base_tree(work)
            trees = {"before": base, "after": ROOT}
            cpu_spec = _spec(work, backends, plan, warmup=300, batches=batches, requests=requests)
            cg_spec = _spec(work, backends, plan, warmup=100, batches=1, requests=cg_requests)
            cpu = _cpu(trees, cpu_spec, cpu_rounds)
            ins = _instructions(trees, cg_spec, work, cg_rounds, cg_requests)
    finally:
        st.stop()
    cpu["method"] = (
        f"{cpu_rounds} interleaved rounds x {batches} batches x {requests} requests, 16 concurrent; "
        "process_time per batch / requests, minimum over a round's batches"
    )
    if "added_instructions_per_request" in ins:
        after_ins = float(np.median(ins["instructions_per_request"]["after"]))
        per_us = after_ins / cpu["min_us"]["after"]  # the gateway's instructions per µs of its CPU, this host
        ins["instructions_per_us"] = round(per_us)
        ins["added_us_per_request"] = round(ins["added_instructions_per_request"] / per_us, 3)
        ins["method"] = (
            f"{cg_rounds} round(s) per tree x {cg_requests} requests under callgrind, counted after 100 warm-up "
            "requests; µs = instructions / (after's instructions per request / its min CPU µs per request)"
        )
    return {"base": base_rev, "instructions": ins, "cpu": cpu}


def _ns(stmt: str, env: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e9


def _micro(quick: bool) -> dict[str, float]:
    from boute.serving.reason import HEADER, RouteReasons

    number = 100_000 if quick else 500_000
    pre = RouteReasons.by_thresholds(["small", "large"], [0.482113])
    cascade = RouteReasons.cascade(["small", "large"], [0.5])
    bad = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # router/http/protocol.py's _BAD_VALUE
    env = {"pre": pre, "cascade": cascade, "bad": bad, "name": HEADER, "value": pre.preroute(1, 0.613218), "parts": []}
    out = {
        "preroute_reason_ns": _ns("pre.preroute(1, 0.613218)", env, number),
        "cascade_escalated_reason_ns": _ns(
            "'cascade' + cascade.escalated(0, 0.111111, False) + cascade.final(1)", env, number
        ),
        "cascade_accepted_reason_ns": _ns("'cascade' + cascade.accepted(0, 0.888889)", env, number),
        "frame_one_header_ns": _ns(
            "bad.search(value); parts.append(f'{name}: {value}\\r\\n'.encode('latin-1')); parts.clear()", env, number
        ),
        "float_format_alone_ns": _ns("f'{0.613218:.4f}'", env, number),
    }
    out["preroute_total_ns"] = out["preroute_reason_ns"] + out["frame_one_header_ns"]
    return {k: round(v, 1) for k, v in out.items()}


def run(quick: bool = True) -> dict[str, Any]:
    micro = _micro(quick)
    measured = _in_process(quick)
    added = measured["instructions"].get("added_us_per_request")
    return {
        "goal_us_per_request": GOAL_US,
        "load_avg_1min_at_start": round(os.getloadavg()[0], 2),
        "micro_ns": micro,
        **measured,
        "met": added is not None and added < GOAL_US and micro["preroute_total_ns"] < GOAL_US * 1e3,
    }
