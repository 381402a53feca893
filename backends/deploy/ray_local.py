"""A Ray cluster on this machine confined to loopback (emulated fleets, tests): nothing listens beyond 127.0.0.1.

Why not only ``ray.init(_node_ip_address="127.0.0.1")``: Ray (2.60 here) turns a loopback node address into the
machine's external one (``services.resolve_ip_for_localhost``) unless Ray clusters are switched off for the
process (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS and Windows, read into
``ray_constants.ENABLE_RAY_CLUSTER``), and its GCS, raylet and agents then listen on every interface. Measured
here: by default the node is 192.0.2.2 and gcs_server, raylet and the workers listen on ``::``, the agents on
0.0.0.0; with the switch and the loopback address, every one of them listens on 127.0.0.1 (and replicas
registered as the node's address are on loopback too). The switch is set in the environment, so Ray's own
processes inherit it, and in the constant when Ray is already imported. It is a Ray internal, so
:func:`check_loopback` verifies the outcome after start-up and stops with one line if a Ray version differs.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from backends.deploy.launch import LOOPBACK
from boute.errors import BouteError

#: the environment that makes Ray keep a local node on loopback (inherited by the processes Ray starts)
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def confine_to_loopback() -> None:
    """Make Ray clusters started from this process (and their own processes) stay on loopback."""
    os.environ.update(LOOPBACK_ENV)
    constants = importlib.import_module("ray._private.ray_constants")
    if hasattr(constants, "ENABLE_RAY_CLUSTER"):  # read at import: set it too when Ray was imported first
        constants.ENABLE_RAY_CLUSTER = False


def check_loopback() -> None:
    """A one-line BouteError unless every live node of the connected cluster is on loopback."""
    import ray

    addresses = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
    if addresses != [LOOPBACK]:
        raise BouteError(
            f"ray {ray.__version__} put its local node on {', '.join(addresses)}, not {LOOPBACK}: its replicas "
            "would be reachable from the network (use the Ray range in pyproject.toml, or --replica-host node)"
        )


def init_local_cluster(
    resources: Mapping[str, float], *, loopback: bool, namespace: str = "boute", num_cpus: int = 1
) -> None:
    """``ray.init`` a new one-node cluster whose custom ``resources`` stand in for GPU types; on loopback only
    when ``loopback`` (checked after start-up). Always a new one (``address="local"``): without an address
    Ray joins the latest cluster started on the machine (``/tmp/ray/ray_current_cluster``, e.g. a test's)."""
    if loopback:
        confine_to_loopback()
    import ray

    extra = {"_node_ip_address": LOOPBACK} if loopback else {}
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources=dict(resources),
        include_dashboard=False,
        namespace=namespace,
        log_to_driver=False,
        **extra,
    )
    if loopback:
        check_loopback()
