"""Each replica type's timing table, built once per process and shared by the simulator and the fast path
(with each scenario's catalog and GPU prices, looked up once per scenario object).

A search evaluates hundreds of plans built from a few dozen replica types (model, GPU, TP, PP, dtype); the
table of one type (:func:`boute.sim.timing.build_timing`: 2,049 batch sizes x 15 decode segments, 8,193
prefill chunk sizes, as Python lists) takes ~10 ms to build, which on the 480-GPU fleet was a third of a
simulation's CPU time when every simulation built its own. The tables are pure functions of the type, the
scenario's catalog and the two engine limits, and nothing writes to them after they are built, so one table
per key serves every caller of this process.

Callers that key caches of their own on a table's ``id`` (:mod:`boute.sim.load_curves`) register a hook
with :func:`on_evict`: when this cache is emptied the tables are freed and their ids may be reused.
"""

from __future__ import annotations

from collections.abc import Callable

from boute.catalog import Catalog
from boute.errors import BouteError, InfeasibleError
from boute.perf import replica_perf, scenario_catalog
from boute.sim.timing import ReplicaTiming, build_timing
from boute.specs.plan import ReplicaGroup
from boute.specs.scenario import Scenario

#: scenario id -> (scenario, its catalog, its GPUs' prices as they are asked): the value keeps the scenario
#: alive, so its id is not reused
_CATALOGS: dict[int, tuple[Scenario, Catalog, dict[str, float]]] = {}
#: (catalog id, hardware, chunk, max running) -> (catalog, timing or why the replica does not fit); the value
#: keeps the catalog alive, so its id in the key cannot be reused by another catalog while the entry lives
_TIMINGS: dict[tuple, tuple[Catalog, ReplicaTiming | str]] = {}
#: replica types kept before the cache is emptied: a table holds ~2 MB (one search uses a few dozen types; a
#: benchmark over hundreds of scenarios would otherwise grow by ~70 MB per scenario)
MAX_TIMINGS = 192
_EVICT_HOOKS: list[Callable[[], None]] = []


def group_label(i: int, g: ReplicaGroup) -> str:
    return f"deployment[{i}] ({g.tier}: {g.count}x {g.model} on {g.gpu}, tp={g.tp}, pp={g.pp}, {g.dtype})"


def on_evict(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever the tables are freed (before new ones are built): caches keyed by a table's id."""
    _EVICT_HOOKS.append(hook)


def _free_tables() -> None:
    """Free every table; the :func:`on_evict` hooks empty the caches keyed by the tables' ids."""
    _TIMINGS.clear()
    for hook in _EVICT_HOOKS:
        hook()


def clear() -> None:
    """Free every table and catalog (a cold start, as a new process has)."""
    _free_tables()
    _CATALOGS.clear()


def _scenario_entry(scenario: Scenario) -> tuple[Scenario, Catalog, dict[str, float]]:
    entry = _CATALOGS.get(id(scenario))
    if entry is None or entry[0] is not scenario:
        if len(_CATALOGS) > 16:
            _CATALOGS.clear()
        entry = _CATALOGS[id(scenario)] = (scenario, scenario_catalog(scenario), {})
    return entry


def catalog_of(scenario: Scenario) -> Catalog:
    """The scenario's catalog (:func:`boute.perf.scenario_catalog`), looked up once per scenario object."""
    return _scenario_entry(scenario)[1]


def gpu_price(scenario: Scenario, gpu: str) -> float:
    """:meth:`Scenario.price`, asked once per scenario object and GPU: a search prices tens of thousands of plans
    of a few GPU types, and the catalog lookup behind a price (~4 us) was a seventh of the fast path's time on
    the 480-GPU fleet."""
    prices = _scenario_entry(scenario)[2]
    price = prices.get(gpu)
    if price is None:
        price = prices[gpu] = scenario.price(gpu)
    return price


def group_timing(i: int, g: ReplicaGroup, scenario: Scenario, chunk: int, max_running: int) -> ReplicaTiming:
    """The timing table of group ``i``'s replica type under ``scenario``'s catalog.

    BouteError when the catalog lacks its GPU or model; InfeasibleError when the model does not fit the
    replica (both name the group). Cached per process (module doc): the same object for the same type.
    """
    cat = catalog_of(scenario)
    key = (id(cat), g.model, g.gpu, g.tp, g.pp, g.dtype, chunk, max_running)
    hit = _TIMINGS.get(key)
    if hit is None:
        if g.gpu not in cat.gpus or g.model not in cat.models:
            raise BouteError(f"{group_label(i, g)}: unknown {'GPU' if g.gpu not in cat.gpus else 'model'}")
        perf = replica_perf(cat.model(g.model), cat.gpu(g.gpu), tp=g.tp, pp=g.pp, dtype=g.dtype)
        if len(_TIMINGS) >= MAX_TIMINGS:
            _free_tables()  # the catalogs stay: a new one for the same scenario would miss every table again
        hit = _TIMINGS[key] = (cat, build_timing(perf, chunk, max_running) if perf.fits else perf.reason)
    tm = hit[1]
    if isinstance(tm, str):
        raise InfeasibleError(f"{group_label(i, g)} cannot serve its model: {tm}")
    return tm
