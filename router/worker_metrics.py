"""One ``/metrics`` for several gateway workers on one port: every worker's figures, merged where scraped.

Why this way: a scrape reaches whichever worker the kernel hands the connection to (SO_REUSEPORT), and a
Prometheus user expects the figures of the whole gateway there, as from one process, never one worker's
counters that jump back and forth between scrapes. Each worker keeps its own in-memory registry (the hot
path pays nothing more: prometheus_client's multiprocess mode writes every increment to a memory-mapped file,
measured at ~1.3 us per counter increment and ~2.9 us per histogram observation against ~0.45 / ~0.73 us in
memory, about 5 us more per request) and writes a snapshot of it to the serve's run folder every
``SNAPSHOT_INTERVAL_S`` and when it stops. The scraped worker merges its own live registry with its peers'
snapshots:

- counters and histograms are summed over every worker that ever ran, the dead included (a replaced worker's
  last snapshot stays, so totals never go back: a dead worker's requests after its last snapshot, at most
  ``SNAPSHOT_INTERVAL_S`` of them, are the only ones missed);
- ``SUMMED_GAUGES`` (requests in flight, judge failures) are summed over the live workers;
- every other gauge describes what the workers share (the plan's promise, the replicas' health: the plan,
  registry and down-marks come through Redis) and is the scraped worker's own; the served shares are
  recomputed from the summed request counts;
- per worker, labelled ``pid``: ``boute_worker_requests`` and ``boute_worker_plan_version`` (has every worker
  adopted the plan?), and ``boute_workers``, the workers live.

A peer's figures are at most ``SNAPSHOT_INTERVAL_S`` old; the scraped worker's are current.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from router.metrics import served_shares

log = logging.getLogger("boute.router.workers")

#: how often each worker writes its snapshot (seconds): the staleness of peers' figures in a scrape
SNAPSHOT_INTERVAL_S = 1.0
#: added up over the live workers (each holds its own share); other gauges are the scraped worker's own
SUMMED_GAUGES = frozenset({"boute_inflight", "boute_judge_failures"})
#: added up over every worker that ever ran
SUMMED_TYPES = frozenset({"counter", "histogram", "summary"})

#: one metric family: name, help, type, and its samples as [sample name, labels, value]
Family = dict[str, Any]
_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Snapshot:
    """One worker's figures: its pid, the plan version it serves, its metric families."""

    pid: int
    plan_version: int
    families: list[Family]
    live: bool = True


def families(registry: CollectorRegistry) -> list[Family]:
    """A registry's families as plain data (``_created`` samples left out: they cannot be summed)."""
    out = []
    for m in registry.collect():
        samples = [[s.name, dict(s.labels), s.value] for s in m.samples if not s.name.endswith("_created")]
        out.append({"name": m.name, "doc": m.documentation, "type": m.type, "samples": samples})
    return out


def merge(own: Snapshot, peers: Sequence[Snapshot]) -> list[Metric]:
    """The families of the whole gateway (rules in the module docstring), ``own`` being the scraped worker."""
    meta: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[_Key, float]] = {}
    for snap in (own, *peers):
        for fam in snap.families:
            name, kind = fam["name"], fam["type"]
            meta.setdefault(name, (fam["doc"], kind))
            summed = kind in SUMMED_TYPES or name in SUMMED_GAUGES
            if not (kind in SUMMED_TYPES or (summed and snap.live) or snap is own):
                continue
            acc = values.setdefault(name, {})
            for sname, labels, value in fam["samples"]:
                key = (sname, tuple(labels.items()))
                acc[key] = acc.get(key, 0.0) + value if summed else value
    if "boute_served_share" in values:
        values["boute_served_share"] = {
            ("boute_served_share", (("tier", t),)): share for t, share in served_shares(_ok(values)).items()
        }
    out = []
    for name, samples in values.items():
        doc, kind = meta[name]
        m = Metric(name, doc, kind)
        for sname, labels in sorted(samples, key=_order):
            m.add_sample(sname, dict(labels), samples[(sname, labels)])
        out.append(m)
    return out + _per_worker(own, peers)


def _ok(values: dict[str, dict[_Key, float]]) -> dict[str, float]:
    """Requests answered 200 per tier, from the summed ``boute_requests`` counter."""
    ok: dict[str, float] = {}
    for (sname, labels), v in values.get("boute_requests", {}).items():
        d = dict(labels)
        if sname == "boute_requests_total" and d.get("code") == "200" and d.get("tier", "-") != "-":
            ok[d["tier"]] = ok.get(d["tier"], 0.0) + v
    return ok


def _order(key: _Key) -> tuple[Any, ...]:
    """Exposition order: by label set, then a histogram's buckets by bound, its count, its sum."""
    sname, labels = key
    rest = tuple(kv for kv in labels if kv[0] != "le")
    le = dict(labels).get("le")
    part = 0 if sname.endswith("_bucket") else 1 if sname.endswith("_count") else 2
    return (rest, part, float(le) if le is not None else 0.0, sname)


def answered(snap: Snapshot) -> float:
    """Completion requests a worker answered (any status), from its ``boute_requests`` counter."""
    return sum(
        v
        for fam in snap.families
        if fam["name"] == "boute_requests"
        for s, _, v in fam["samples"]
        if s.endswith("_total")
    )


def _per_worker(own: Snapshot, peers: Iterable[Snapshot]) -> list[Metric]:
    live = [own, *(p for p in peers if p.live)]
    n = Metric("boute_workers", "gateway worker processes serving this port", "gauge")
    n.add_sample("boute_workers", {}, float(len(live)))
    req = Metric("boute_worker_requests", "completion requests each live worker process has answered", "gauge")
    ver = Metric("boute_worker_plan_version", "the plan version each live worker process serves", "gauge")
    for s in sorted(live, key=lambda s: s.pid):
        req.add_sample("boute_worker_requests", {"pid": str(s.pid)}, answered(s))
        ver.add_sample("boute_worker_plan_version", {"pid": str(s.pid)}, float(s.plan_version))
    return [n, req, ver]


class _Families:
    """What :func:`prometheus_client.generate_latest` renders: anything with ``collect()``."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def ready_file(directory: Path, pid: int) -> Path:
    """Written by a worker once it listens; removed by the supervisor when the worker exits."""
    return directory / f"{pid}.ready"


def snapshot_file(directory: Path, pid: int) -> Path:
    return directory / f"{pid}.json"


def read_snapshot(path: Path) -> Snapshot:
    """A snapshot file as written by :meth:`WorkerMetrics.write` (``live`` is for the reader to decide)."""
    doc = json.loads(path.read_text())
    return Snapshot(int(doc["pid"]), int(doc["plan_version"]), doc["families"])


def retire(directory: Path, pid: int) -> None:
    """A worker exited: its gauges leave the merge; its snapshot stays, so do its counts."""
    ready_file(directory, pid).unlink(missing_ok=True)


class WorkerMetrics:
    """This worker's side: write its snapshot, read its peers', render the merge (:class:`router.metrics.Fleet`)."""

    def __init__(self, directory: Path, registry: CollectorRegistry, plan_version: Callable[[], int]) -> None:
        self.dir, self.registry, self.plan_version = directory, registry, plan_version
        self.pid = os.getpid()

    def snapshot(self) -> Snapshot:
        return Snapshot(self.pid, self.plan_version(), families(self.registry))

    def write(self) -> None:
        """This worker's snapshot, replaced atomically (a reader never sees half a file)."""
        s = self.snapshot()
        tmp = self.dir / f".{self.pid}.json.tmp"
        tmp.write_text(json.dumps({"pid": s.pid, "plan_version": s.plan_version, "families": s.families}))
        os.replace(tmp, snapshot_file(self.dir, self.pid))

    def mark_ready(self) -> None:
        """Listening: announce it (after a first snapshot). A snapshot already under this pid is a dead worker's
        that had it: moved aside, its counts kept."""
        mine = snapshot_file(self.dir, self.pid)
        if mine.exists():
            os.replace(mine, self.dir / f"dead-{self.pid}-{os.urandom(4).hex()}.json")
        self.write()
        ready_file(self.dir, self.pid).touch()

    def peers(self) -> list[Snapshot]:
        """Every other worker's last snapshot, the dead's included (``live`` False)."""
        live = {int(p.stem) for p in self.dir.glob("*.ready") if p.stem.isdigit()}
        own = snapshot_file(self.dir, self.pid).name
        out = []
        for f in self.dir.glob("*.json"):
            if f.name == own:
                continue
            try:
                snap = read_snapshot(f)
            except (OSError, ValueError):  # a file moved aside while being read
                continue
            current = f.name == snapshot_file(self.dir, snap.pid).name  # not a dead worker's moved aside
            out.append(replace(snap, live=current and snap.pid in live))
        return out

    def render(self) -> bytes:
        return generate_latest(_Families(merge(self.snapshot(), self.peers())))

    async def run(self, interval_s: float = SNAPSHOT_INTERVAL_S) -> None:
        """Write the snapshot every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.write()
            except OSError as exc:  # the run folder went away (the serve is stopping)
                log.debug("metrics snapshot not written: %s", exc)
