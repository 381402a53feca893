"""Helpers shared by the deployment tests: a load generator that counts failures while a fleet changes."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx

from tests.waits import SAFETY_S, until

PLAN_A = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {"tiers": ["small", "large"], "fractions": [0.5, 0.5], "scorer": "length", "reference": "builtin:gsm8k"},
    "deployment": [
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 2},
        {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "tp": 4},
    ],
}
PLAN_B = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {"tiers": ["small", "large"], "fractions": [0.6, 0.4], "scorer": "length", "reference": "builtin:gsm8k"},
    "deployment": [
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-5090", "count": 1},
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 1},
        {"tier": "large", "model": "llama-3.1-70b", "gpu": "rtx-pro-6000", "tp": 2},
    ],
}


class Load:
    """``clients`` threads sending chat requests (half forced to each tier) until stopped. Tests act on what
    it has done (:meth:`more_answers`), not on how long it has run (a busy machine answers fewer per second)."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url, self.clients = url, clients
        self.outcomes: Counter[str] = Counter()
        self.tiers: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, i: int) -> None:
        model = ["router-small", "router-large", "boute"][i % 3]
        with httpx.Client(base_url=self.url, timeout=SAFETY_S, trust_env=False) as c:
            while not self._stop.is_set():
                body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 8}
                try:
                    r = c.post("/v1/chat/completions", json=body)
                    key, tier = str(r.status_code), r.headers.get("x-boute-tier")
                except httpx.HTTPError as exc:
                    key, tier = type(exc).__name__, None
                with self._lock:
                    self.outcomes[key] += 1
                    if tier:
                        self.tiers[tier] += 1
                time.sleep(0.01)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=SAFETY_S + 10)  # a request in flight ends within its own timeout

    @property
    def failed(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k != "200")

    def more_answers(self, n: int, what: str) -> None:
        """Wait until ``n`` more requests have come back (any outcome: a failure must not stall the wait)."""
        with self._lock:
            target = sum(self.outcomes.values()) + n
        until(lambda: sum(self.outcomes.values()) >= target, what)


def wait_for(pred, timeout: float = SAFETY_S, interval: float = 0.1) -> bool:
    """True once ``pred()`` is; False after ``timeout`` s (the safety bound of :mod:`tests.waits`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def listening_ips(*pids: int, tree: bool = False) -> set[str]:
    """The addresses the processes ``pids`` (and, with ``tree``, their descendants) listen on; an IPv4-mapped
    IPv6 address counts as its IPv4 one (``::ffff:127.0.0.1`` is loopback)."""
    import psutil

    procs = [psutil.Process(p) for p in pids]
    if tree:
        procs += [c for p in list(procs) for c in p.children(recursive=True)]
    out: set[str] = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:  # gone meanwhile
            continue
        out |= {c.laddr.ip.removeprefix("::ffff:") for c in conns if c.status == psutil.CONN_LISTEN}
    return out


def url_host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or ""
