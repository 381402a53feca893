"""Read and write spec files (YAML or JSON) with errors that name the file; writes are atomic."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from boute.errors import SpecError, from_validation_error

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML/JSON file into a mapping; malformed or non-mapping content is a SpecError."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(p, None, "file not found") from None
    except OSError as exc:
        raise SpecError(p, None, f"cannot read file: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(p, f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(p, where, f"malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(p, None, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate(model: type[M], data: dict[str, Any], file: str | Path | None, context: Any = None) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise from_validation_error(exc, file) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_atomic(path: str | Path, data: str | bytes | Callable[[IO[bytes]], object]) -> Path:
    """Write ``data`` (text as UTF-8, bytes, or a function writing to the binary file) via a temp file in the
    same folder + rename, so readers never see half a file. The one atomic writer: plans, configs, router
    weights and embedding tables all go through it, with the ordinary file mode (umask), not mkstemp's 0600."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; these are ordinary files
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks (bundle files and router weights are named by it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dump_model(obj: BaseModel, path: str | Path) -> Path:
    """Serialise a spec as JSON (``.json``) or YAML (anything else), atomically."""
    p = Path(path)
    data = obj.model_dump(mode="json", exclude_none=True)
    text = json.dumps(data, indent=2) + "\n" if p.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    return write_atomic(p, text)
