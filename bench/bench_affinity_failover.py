"""Failover and a rolling update under load, with prefix affinity on and off (issue 51: what affinity must show).

One tier of 4 emulated replicas (one process each, ``speedup`` as in the tests) behind one gateway; an async
closed loop from this process sends chats over 12 shared system prompts (~300-400 tokens each, Zipf-skewed
popularity), each chat 1-4 turns (the follow-ups carry the conversation so far). Phases, each bounded by a
count of answers (never by sleeping):

1. ``steady``: the 4 replicas;
2. ``kill``: one replica SIGKILLed at the phase's start, the load going on (the gateway retries its requests);
3. ``add``: the rolling update's first half: a replacement replica started, healthy, and registered through
   the gateway's admin API (``PUT /admin/backends``, as a deployer does);
4. ``retire``: its second half: another replica taken out of the registry the same way (gracefully: its
   requests in flight finish), then stopped (SIGINT) once the load has run on without it.

Per phase: requests, failed (non-200 or transport errors), answered per replica, the hot spot (max/mean
answered per replica among the replicas in the pool at the phase's end), the share of requests the gateway
routed by affinity (``boute_affinity_routed_total{reason}``, differenced over the phase; 0 with affinity off),
and the cached-token share the replicas reported (``usage.prompt_tokens_details.cached_tokens`` /
``prompt_tokens``; the emulated replicas run with ``enable_cache_report``). The same phases run again, on fresh
replicas, with affinity off (least load) for comparison. The load generator's CPU (this process) and the
gateway's are reported as a share of one core over the run, to show the client is not the bottleneck.

``python -m bench affinity_failover [--quick]`` writes ``bench/results/affinity_failover.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from typing import Any

import httpx

from backends.emulated.launch import registry, replica_configs, spawn_replicas, wait_http
from boute.sim.affinity import REASONS
from boute.specs import load_scenario
from boute.specs.plan import Plan
from tests.closed_loop import ClosedLoop
from tests.stack import Stack
from tests.waits import SAFETY_S

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEEDUP = 50.0
WORKERS = 16
PLAN: dict[str, Any] = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {"tiers": ["small"], "fractions": [1.0]},
    "deployment": [{"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 4}],
    "affinity": {"enabled": False},  # the gateway's BOUTE_AFFINITY=true turns it on (defaults otherwise)
}
TOPICS = [
    "billing",
    "travel",
    "medicine",
    "law",
    "cooking",
    "gardening",
    "tax",
    "code",
    "music",
    "chess",
    "math",
    "art",
]
SYSTEM = [
    f"You are the {t} assistant of team {i}. "
    + " ".join(f"Rule {i}.{k}: answer about {t} briefly, cite section {k} of the {t} manual." for k in range(18))
    for i, t in enumerate(TOPICS)
]
POPULARITY = [1.0 / (i + 1) for i in range(len(SYSTEM))]  # Zipf: the first prompt ~32% of chats, the last ~3%


class _Conn:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams: a few times cheaper per request than httpx,
    so the load generator stays far from a core while the gateway and replicas share the machine."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        try:
            self.writer.write(head.encode() + body)
            raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), SAFETY_S)
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            if headers.get("transfer-encoding") == "chunked":
                data = b""
                while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
                    data += (await self.reader.readexactly(size + 2))[:-2]
                await self.reader.readuntil(b"\r\n")
            else:
                data = await self.reader.readexactly(int(headers.get("content-length", "0")))
            if headers.get("connection") == "close":
                self.close()
            return status, headers, data
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class _Load(ClosedLoop):
    """Closed-loop chats; records (replica, status, prompt_tokens, cached_tokens) of every answer."""

    def __init__(self, url: str, workers: int, seed: int) -> None:
        super().__init__(url, workers)
        self.rng = random.Random(seed)
        self.chats: list[tuple[list[dict[str, str]], int]] = [([], 0)] * workers  # messages, turns left
        self.answers: list[tuple[str, int, int, int]] = []
        u = httpx.URL(url)
        self.conns = [_Conn(u.host, u.port or 80) for _ in range(workers)]

    async def one(self, client: httpx.AsyncClient, worker: int, n: int) -> None:
        messages, left = self.chats[worker]
        if left == 0:
            system = self.rng.choices(SYSTEM, POPULARITY)[0]
            messages, left = [{"role": "system", "content": system}], self.rng.randint(1, 4)
        messages = [*messages, {"role": "user", "content": f"Question {n} of worker {worker}: what does it say?"}]
        body = json.dumps({"model": "boute", "messages": messages, "max_tokens": 8}).encode()
        try:
            status, headers, data = await self.conns[worker].post("/v1/chat/completions", body)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            self.answers.append(("", -1, 0, 0))
            self.chats[worker] = ([], 0)
            return
        prompt = cached = 0
        reply = ""
        if status == 200:
            doc = json.loads(data)
            usage = doc.get("usage") or {}
            prompt = int(usage.get("prompt_tokens") or 0)
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            reply = doc["choices"][0]["message"].get("content") or ""
        self.answers.append((headers.get("x-boute-replica", ""), status, prompt, cached))
        self.chats[worker] = ([*messages, {"role": "assistant", "content": reply}], left - 1)

    async def more(self, n: int, what: str) -> int:
        start = len(self.answers)
        await self.reach(lambda: len(self.answers), start + n, what)
        return start


#: the key under which ``routed()`` keeps the answer count beside the counters
ANSWERS = "_answers"


def _routed(text: str) -> dict[str, float]:
    out = {}
    for reason in REASONS:
        m = re.search(r'boute_affinity_routed_total\{reason="' + reason + r'",tier="small"\} ([0-9.e+]+)', text)
        out[reason] = float(m.group(1)) if m else 0.0
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(
    name: str, answers: list[tuple[str, int, int, int]], pool: list[str], r0: dict[str, float], r1: dict[str, float]
) -> dict[str, Any]:
    per = Counter(rep for rep, status, _, _ in answers if status == 200)
    loads = [per.get(p, 0) for p in pool]
    mean = sum(loads) / len(loads)
    routed = {k: r1[k] - r0[k] for k in REASONS}
    total = sum(routed.values())
    window = int(r1[ANSWERS] - r0[ANSWERS])  # answers while the counters moved (the phase's and the gaps')
    prompt = sum(a[2] for a in answers)
    return {
        "phase": name,
        "requests": len(answers),
        "failed": sum(1 for a in answers if a[1] != 200),
        "answered_per_replica": dict(sorted(per.items())),
        "pool_at_end": pool,
        "hot_spot_max_over_mean": round(max(loads) / mean, 3) if mean else None,
        "routed": routed,
        "answers_in_counter_window": window,
        "picks_per_answer": round(total / window, 3) if window and total else None,
        "affinity_share": round(routed["affinity"] / total, 3) if total else 0.0,
        "cached_token_share": round(sum(a[3] for a in answers) / prompt, 3) if prompt else 0.0,
    }


async def _scenario(affinity: bool, per_phase: int) -> dict[str, Any]:
    st = await asyncio.to_thread(Stack.start, PLAN, SPEEDUP)
    extra: list[Any] = []
    try:
        env = {"BOUTE_ADMIN_TOKEN": TOKEN, **({"BOUTE_AFFINITY": "true"} if affinity else {})}
        url, gw = await asyncio.to_thread(lambda: st.gateway(**env))
        assert st.backends_file is not None
        entries: list[dict[str, Any]] = json.loads(st.backends_file.read_text())
        procs = dict(zip([e["name"] for e in entries], st.replicas, strict=True))
        pool = [e["name"] for e in entries]
        phases: list[dict[str, Any]] = []
        async with httpx.AsyncClient(timeout=SAFETY_S) as admin:

            async def routed() -> dict[str, float]:
                """The gateway's affinity counters, and the answers the load had when they were read: the
                counters' window also holds what was answered between phases (a replica starting), so the
                picks are compared with the answers of that same window."""
                got = _routed((await admin.get(url + "/metrics")).text)
                return {**got, ANSWERS: float(len(load.answers))}

            async with _Load(url, WORKERS, seed=1) as load:
                await load.more(WORKERS * 2, "warm-up answers")  # caches and the index warm, not counted
                t0, cpu0, gcpu0 = time.perf_counter(), time.process_time(), _cpu_s(gw.pid)
                # 1. steady
                r0 = await routed()
                start = await load.more(per_phase, "steady answers")
                r1 = await routed()
                phases.append(_phase("steady", load.answers[start : start + per_phase], pool, r0, r1))
                # 2. SIGKILL the first replica mid-load
                victim = pool[0]
                await asyncio.to_thread(st.kill_replica, 0)
                pool = pool[1:]
                start = await load.more(per_phase, "answers after the kill")
                r2 = await routed()
                phases.append(_phase("kill", load.answers[start : start + per_phase], pool, r1, r2))
                # 3a. rolling update: a replacement up, healthy, registered
                one = Plan.model_validate({**PLAN, "deployment": [{**PLAN["deployment"][0], "count": 1}]})
                cfg = replica_configs(one, load_scenario(None), SPEEDUP)
                new = spawn_replicas(cfg, st.workdir, one_process=False)
                extra.extend(new)
                spec = registry(one, cfg)[0]
                await asyncio.to_thread(wait_http, str(spec["url"]) + "/health", SAFETY_S, new)
                entries = [e for e in entries if e["name"] != victim] + [spec]
                put = await admin.put(url + "/admin/backends", json=entries, headers=AUTH)
                assert put.status_code == 200, put.text
                pool = [*pool, str(spec["name"])]
                start = await load.more(per_phase, "answers after the replacement joined")
                r3 = await routed()
                phases.append(_phase("add", load.answers[start : start + per_phase], pool, r2, r3))
                # 3b. retire another replica gracefully: out of the registry, then stopped once drained
                retired = pool[0]
                entries = [e for e in entries if e["name"] != retired]
                put = await admin.put(url + "/admin/backends", json=entries, headers=AUTH)
                assert put.status_code == 200, put.text
                pool = pool[1:]
                start = await load.more(per_phase // 4, "answers after the retirement")
                procs[retired].send_signal(2)  # SIGINT: its requests in flight (if any) finished above
                await asyncio.to_thread(procs[retired].wait, 10)
                await load.more(per_phase - per_phase // 4, "answers after the retired replica stopped")
                r4 = await routed()
                phases.append(_phase("retire", load.answers[start : start + per_phase], pool, r3, r4))
                wall, cpu, gcpu = time.perf_counter() - t0, time.process_time() - cpu0, _cpu_s(gw.pid) - gcpu0
        return {
            "affinity": affinity,
            "phases": phases,
            "wall_s": round(wall, 2),
            "answers_per_s": round(4 * per_phase / wall, 1),
            "load_generator_cpu_share_of_one_core": round(cpu / wall, 3),
            "gateway_cpu_share_of_one_core": round(gcpu / wall, 3),
        }
    finally:
        for p in extra:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        await asyncio.to_thread(st.stop)


def _table(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| affinity | phase | requests | failed | answered per replica (port) | hot spot max/mean | routed by affinity "
        "| cached-token share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run_ in runs:
        for p in run_["phases"]:
            per = ", ".join(f"{k.rsplit('-', 1)[-1]}: {v}" for k, v in p["answered_per_replica"].items())
            rows.append(
                f"| {'on' if run_['affinity'] else 'off'} | {p['phase']} | {p['requests']} | {p['failed']} | {per} "
                f"| {p['hot_spot_max_over_mean']} | {p['affinity_share']:.0%} | {p['cached_token_share']:.0%} |"
            )
    return "\n".join(rows)


def run(quick: bool = False) -> dict[str, Any]:
    per_phase = 150 if quick else 1500
    runs = [asyncio.run(_scenario(affinity, per_phase)) for affinity in (True, False)]
    table = _table(runs)
    print(table, flush=True)
    for r in runs:
        print(
            f"affinity {'on' if r['affinity'] else 'off'}: {r['answers_per_s']} answers/s; CPU of one core: "
            f"load generator {r['load_generator_cpu_share_of_one_core']:.0%}, "
            f"gateway {r['gateway_cpu_share_of_one_core']:.0%}",
            flush=True,
        )
    return {
        "replicas": 4,
        "speedup": SPEEDUP,
        "workers": WORKERS,
        "answers_per_phase": per_phase,
        "system_prompts": len(SYSTEM),
        "system_prompt_chars": [len(s) for s in SYSTEM],
        "popularity": [round(p / sum(POPULARITY), 3) for p in POPULARITY],
        "runs": runs,
        "table": table,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick=True), indent=2))
