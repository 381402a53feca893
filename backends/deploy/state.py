"""The deployment state file: where ``boute deploy status`` and ``down`` find what runs.

Written atomically (temp file + rename) by the controller after every change, so a reader never sees half
a file; ``pid`` is the controller daemon's, so a stale file (daemon gone) is recognised as such.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from boute.errors import BouteError
from boute.specs.io import write_atomic

STATE_FILE, CONFIG_FILE, DESIRED_FILE, DAEMON_LOG = "state.json", "config.json", "desired.json", "daemon.log"


def default_dir() -> Path:
    return Path(os.environ.get("BOUTE_DEPLOY_DIR") or Path.home() / ".boute" / "deploy")


def write_state(directory: Path, state: dict[str, Any]) -> None:
    write_atomic(directory / STATE_FILE, json.dumps({**state, "updated_at": time.time()}, indent=2) + "\n")


def read_state(directory: Path) -> dict[str, Any] | None:
    """The state, or None when nothing was ever deployed here; a corrupt file is a one-line error."""
    p = directory / STATE_FILE
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BouteError(f"{p}: unreadable deployment state ({exc})") from None
    if not isinstance(data, dict):
        raise BouteError(f"{p}: deployment state is not a JSON object")
    return data


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0): look at its state where /proc exists
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def running(state: dict[str, Any] | None) -> bool:
    return state is not None and state.get("status") != "stopped" and pid_alive(state.get("pid"))
