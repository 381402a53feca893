"""The plan bundle: a plan file plus every file serving needs to reproduce it, checked by content hash.

``write_plan(plan, out, scenario, router_files)`` writes ``<out>`` (JSON/YAML) and, beside it, the folder
``<out stem>.bundle/`` holding the router's (or a cascade's verifier's) files and the scenario's own files (a
user profile, trace or calibration), each in a sub-folder named by the hash of its content, so a re-written
plan never clobbers a file an older plan still names. The plan carries the scenario inline
(``scenario_spec``) with those references rewritten to bundle paths, which resolve against the plan's
folder: copy the plan and its bundle anywhere and it opens, serves and verifies the same. Files are written first, the plan last
(atomically): a reader never sees a plan whose files are missing. The plan also carries the capacity each
replica group is balanced by under the scenario's workload (``balance``, :mod:`boute.sim.weights`).

``open_plan(path)`` loads a plan, checks every artifact's hash and the deployment's hardware against the
catalog the plan's own scenario defines; any mismatch is a one-line :class:`SpecError` naming the file,
field and reason. ``plan_scenario(plan, path)`` gives back the scenario the plan was optimised for.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boute.catalog import Catalog
from boute.errors import SpecError
from boute.specs.io import read_mapping, sha256_file, validate, write_atomic
from boute.specs.plan import Artifact, Plan, check_plan_hardware, save_plan
from boute.specs.scenario import Scenario, scenario_from_mapping

if TYPE_CHECKING:
    from boute.workload import Workload

BUNDLE_SUFFIX = ".bundle"


def bundle_dir(plan_path: str | Path) -> Path:
    p = Path(plan_path)
    return p.with_name(p.stem + BUNDLE_SUFFIX)


class _Packer:
    """Copies files into the bundle, one content-addressed folder per group of files that belong together."""

    def __init__(self, plan_path: Path) -> None:
        self.root = plan_path.parent
        self.bundle = bundle_dir(plan_path)
        self.artifacts: dict[str, str] = {}  # relative path -> sha256

    def add(self, role: str, files: Sequence[Path]) -> list[str]:
        """Copy ``files`` (kept together under their own names: a router's metadata names its table by name)
        and return their paths relative to the plan's folder, in order."""
        hashes = [sha256_file(f) for f in files]
        group = hashlib.sha256("".join(hashes).encode()).hexdigest()[:16]
        folder = self.bundle / f"{role}-{group}"
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for f, digest in zip(files, hashes, strict=True):
            dest = folder / f.name
            if not dest.is_file() or sha256_file(dest) != digest:
                tmp = dest.with_name(f".{dest.name}.tmp")
                shutil.copyfile(f, tmp)
                tmp.replace(dest)
            rel = dest.relative_to(self.root).as_posix()
            self.artifacts[rel] = digest
            out.append(rel)
        return out


def _local(ref: str | None) -> bool:
    return bool(ref) and not str(ref).startswith("builtin:")


def write_plan(
    plan: Plan,
    out: str | Path,
    scenario: Scenario,
    router_files: Sequence[Path] = (),
    *,
    verifier_files: Sequence[Path] = (),
    workload: Workload | None = None,
) -> Path:
    """Write ``plan`` self-contained (see module doc); ``router_files`` are the plan's trained router's files
    (the ladder's or, scorer ``multi``, the multi router's), the weights file first (what ``routing.router``
    names; the scenario's ``quality.router`` too when it is of the kind a scenario names there);
    ``verifier_files`` the cascade verifier's, likewise (what ``routing.verifier`` names); ``workload`` the
    stream the plan was judged on, whose request lengths its balance weights are computed under (None: the
    scenario's whole workload)."""
    from boute.quality.router_kinds import router_kind  # loaded by a plan's writer, not by every plan reader

    path = Path(out)
    pack = _Packer(path)
    spec: dict[str, Any] = scenario.model_dump(mode="json", exclude_none=True)
    quality, workload_spec = dict(spec.get("quality", {})), dict(spec.get("workload", {}))
    routing = plan.routing.model_dump(exclude_none=True)

    if _local(scenario.quality.profile):
        (quality["profile"],) = pack.add("profile", [scenario.resolve_path(scenario.quality.profile)])
    if router_files:
        bundled = pack.add("router", [Path(f) for f in router_files])
        routing["router"] = bundled[0]
    scorer = plan.routing.scorer
    if router_files and scorer is not None and router_kind(scorer).scenario_router:  # quality.router: its kind's
        quality["router"] = bundled[0]
    elif _local(scenario.quality.router):
        quality.pop("router")  # the plan names the router it was routed with, not the scenario's input
    if verifier_files:
        (routing["verifier"], *_) = pack.add("verifier", [Path(f) for f in verifier_files])
    if routing.get("scorer") is not None:
        routing["reference"] = quality.get("profile", scenario.quality.profile)
    arrivals = dict(workload_spec.get("arrivals", {}))
    if arrivals.get("kind", "trace") == "trace" and _local(scenario.workload.arrivals.trace):
        (arrivals["trace"],) = pack.add("trace", [scenario.resolve_path(scenario.workload.arrivals.trace)])
        workload_spec["arrivals"] = arrivals
    if _local(scenario.calibration):
        (spec["calibration"],) = pack.add("calibration", [scenario.resolve_path(str(scenario.calibration))])
    spec["quality"], spec["workload"] = quality, workload_spec

    from boute.sim.weights import plan_balance

    full = plan.model_copy(
        update={
            "routing": plan.routing.model_validate(routing),
            "scenario": scenario.reference,
            "scenario_spec": spec,
            "artifacts": [Artifact(path=p, sha256=h) for p, h in sorted(pack.artifacts.items())],
            # the simulator's replica weights under the stream the plan was judged on (``workload``: the
            # search's; None: the scenario's whole workload): the gateway balances by them
            "balance": plan_balance(plan.deployment, scenario, workload),
        }
    )
    return save_plan(full, path)


def check_artifacts(plan: Plan, root: Path, file: str | Path | None) -> None:
    """Every artifact exists under ``root`` with its recorded hash (SpecError naming the first that does not)."""
    for i, a in enumerate(plan.artifacts):
        p = root / a.path
        if not p.is_file():
            raise SpecError(file, f"artifacts[{i}].path", f"'{a.path}' not found beside the plan (copy its bundle too)")
        if sha256_file(p) != a.sha256:
            raise SpecError(file, f"artifacts[{i}].sha256", f"'{a.path}' does not match the hash the plan recorded")
    named = {a.path for a in plan.artifacts}
    refs = (
        ("routing.router", plan.routing.router),
        ("routing.reference", plan.routing.reference),
        ("routing.verifier", plan.routing.verifier),
    )
    for field, ref in refs:
        if _local(ref) and ref not in named:
            raise SpecError(file, field, f"'{ref}' is not one of the plan's artifacts: its content is unchecked")


def bundle_files(plan: Plan, root: Path) -> list[tuple[str, bytes]]:
    """``(sha256, bytes)`` of each of the plan's bundle files under ``root``, each checked against its hash:
    what goes to the shared store (``RedisKeys.artifact``) so every gateway can load the plan, wherever it
    runs. Both publishers (``boute deploy`` and the gateway's admin API) upload exactly this."""
    out = []
    for i, a in enumerate(plan.artifacts):
        try:
            data = (root / a.path).read_bytes()
        except OSError as exc:
            raise SpecError("plan", f"artifacts[{i}]", f"'{a.path}' cannot be read under {root}: {exc}") from None
        if hashlib.sha256(data).hexdigest() != a.sha256:
            raise SpecError("plan", f"artifacts[{i}]", f"'{a.path}' under {root} does not match its sha256")
        out.append((a.sha256, data))
    return out


def plan_catalog(plan: Plan, file: str | Path | None = None) -> Catalog:
    """The catalog the plan's hardware comes from: packaged entries plus its scenario's own."""
    from boute.catalog import builtin_catalog

    if not plan.scenario_spec:
        return builtin_catalog()
    from boute.catalog import GPUSpec, ModelSpec

    spec = plan.scenario_spec
    try:
        gpus = [GPUSpec.model_validate(g) for g in spec.get("gpus", [])]
        models = [ModelSpec.model_validate(m) for m in spec.get("models", [])]
    except ValueError as exc:
        raise SpecError(file, "scenario_spec", f"invalid catalog entry: {str(exc).splitlines()[0]}") from None
    return builtin_catalog().extended(gpus, models)


def open_plan(path: str | Path, root: Path | None = None) -> Plan:
    """Load and check a plan: schema, artifacts (``root``: where they live, default the plan's folder) and
    hardware against the plan's own catalog."""
    p = Path(path)
    plan = validate(Plan, read_mapping(p), p)
    check_artifacts(plan, root or p.parent, p)
    check_plan_hardware(plan, plan_catalog(plan, p), p)
    return plan


def plan_scenario(plan: Plan, path: str | Path, root: Path | None = None) -> Scenario | None:
    """The scenario the plan was optimised for, its relative file references resolved against ``root``
    (default: the plan's folder); None for a plan written without one."""
    if not plan.scenario_spec:
        return None
    base = root or Path(path).parent
    return scenario_from_mapping(plan.scenario_spec, base / Path(path).name, shown=f"{path} (scenario_spec)")


def artifacts_present(plan: Plan, root: Path) -> bool:
    try:
        check_artifacts(plan, root, None)
    except SpecError:
        return False
    return True


def materialise(plan: Plan, fetch: Callable[[str], bytes | None] | None, root: Path | None, cache: Path) -> Path:
    """A folder where the plan's artifacts lie with their recorded hashes: ``root`` when they are there, else
    ``cache/<digest of the artifact list>`` filled through ``fetch(sha256) -> bytes`` (a gateway receiving a
    plan over Redis fetches the bundle's files from there). SpecError when an artifact cannot be had."""
    if root is not None and artifacts_present(plan, root):
        return root
    digest = hashlib.sha256("".join(f"{a.path}={a.sha256};" for a in plan.artifacts).encode()).hexdigest()[:16]
    dest = cache / digest
    for i, a in enumerate(plan.artifacts):
        target = dest / a.path
        if target.is_file() and sha256_file(target) == a.sha256:
            continue
        data = fetch(a.sha256) if fetch is not None else None
        if data is None or hashlib.sha256(data).hexdigest() != a.sha256:
            where = f"beside the plan ({root})" if root is not None else "locally"
            raise SpecError("plan", f"artifacts[{i}]", f"'{a.path}' is neither {where} nor in the shared store")
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data)  # a unique temp name: gateways on one host share this cache
    return dest


def artifact_cache() -> Path:
    """Where fetched bundle files are kept (``$BOUTE_CACHE_DIR/plans`` or ``~/.cache/boute/plans``)."""
    from boute.data import cache_dir

    return cache_dir() / "plans"


def scenario_profile(scenario: Scenario) -> str:
    """The scenario's quality profile as a reference that works from any folder (builtin:NAME or absolute)."""
    ref = scenario.quality.profile
    return ref if ref.startswith("builtin:") else str(scenario.resolve_path(ref).resolve())


def write_catalog(plan: Plan, scenario: Scenario | None, path: str | Path) -> Path:
    """The catalog entries of the plan's GPUs and models, as the optimiser saw them (the scenario's own
    entries and its calibration applied), for replicas that time themselves with the performance model."""
    import yaml

    from boute.perf import scenario_catalog

    cat = scenario_catalog(scenario) if scenario is not None else plan_catalog(plan)
    gpus = sorted({g.gpu for g in plan.deployment})
    models = sorted({g.model for g in plan.deployment})
    doc = {
        "gpus": [cat.gpu(g).model_dump(mode="json", exclude_none=True) for g in gpus],
        "models": [cat.model(m).model_dump(mode="json", exclude_none=True) for m in models],
    }
    return write_atomic(path, yaml.safe_dump(doc, sort_keys=False))


def copy_plan(src: str | Path, plan: Plan, dest: str | Path) -> Path:
    """Copy an opened plan and its bundle files to ``dest`` (same relative layout), plan last."""
    src_root, dest_path = Path(src).parent, Path(dest)
    for a in plan.artifacts:
        target = dest_path.parent / a.path
        if target.is_file() and sha256_file(target) == a.sha256:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(src_root / a.path, tmp)
        tmp.replace(target)
    return save_plan(plan, dest_path)
