"""Pins (issue 28 item 4): the committed constraints file pins what the project installs at the versions this
virtualenv was tested with, uvicorn is bounded to the range whose internals the gateway uses, and the
gateway checks those internals at start-up, falling back to uvicorn's stock protocol with one warning."""

from __future__ import annotations

import logging
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: '{line}' is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def _project_requirements(*extras: str) -> list[Requirement]:
    """This checkout's own requirements (pyproject.toml, not the installed copy's metadata)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    return [Requirement(r) for r in raw]


def _closure(roots: list[Requirement]) -> set[str]:
    """Every distribution ``roots`` need here, transitively (markers evaluated for this interpreter, each
    distribution walked once per extra it is asked with)."""
    walked: set[tuple[str, str]] = set()
    todo = [r for r in roots if r.marker is None or r.marker.evaluate()]
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        for extra in ("", *req.extras):
            if (key, extra) in walked:
                continue
            walked.add((key, extra))
            for raw in metadata.requires(req.name) or []:
                dep = Requirement(raw)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    todo.append(dep)
    return {key for key, _ in walked}


def test_constraints_pin_everything_the_project_installs_at_the_installed_versions() -> None:
    pins = _constraints()
    needed = _closure(_project_requirements("dev"))
    assert len(needed) > 100  # the closure was really walked (boute[dev] pulls ~160 distributions)
    assert sorted(needed - set(pins)) == []
    from tools.lock import installed as what_is_installed

    # as imports see them (first on sys.path wins: setuptools' vendored copies of packaging and platformdirs
    # come later on the path once setuptools is imported)
    installed = {canonicalize_name(n): v for n, v in what_is_installed().items()}
    wrong = {n: (pins[n], installed[n]) for n in pins if n in installed and Version(installed[n]).public != pins[n]}
    assert wrong == {}
    assert "boute" not in pins and pins["torch"] == Version(installed["torch"]).public  # 2.13.0, not 2.13.0+cpu


def test_lock_renders_the_venv_as_exact_pins() -> None:
    from tools.lock import render

    text = render({"torch": "2.13.0+cpu", "PyYAML": "6.0.4", "boute": "0.1.0", "pip": "26.3", "anyio": "4.16.0"})
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert body == ["anyio==4.16.0", "PyYAML==6.0.4", "torch==2.13.0"]  # sorted, labels dropped, project/pip out


def test_uvicorn_is_bounded_to_the_range_whose_internals_the_gateway_uses() -> None:
    (spec,) = [r for r in _project_requirements() if r.name == "uvicorn"]
    assert Version(metadata.version("uvicorn")) in spec.specifier
    assert Version("0.44.0") not in spec.specifier  # no _start_asgi_task before 0.45
    assert any(s.operator == "<" for s in spec.specifier)  # and a ceiling: later internals are untested


def test_the_installed_uvicorn_has_the_internals() -> None:
    from router.http.uvicorn_compat import missing_internals

    assert missing_internals() == []


def _without_pipeline() -> type:
    """A subclass of uvicorn's protocol whose instances lack ``pipeline`` (as a refactor upstream might)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    def __init__(self, *args, **kwargs) -> None:
        HttpToolsProtocol.__init__(self, *args, **kwargs)
        del self.pipeline

    return type("WithoutPipeline", (HttpToolsProtocol,), {"__init__": __init__})


def _without_start_task() -> type:
    """uvicorn before 0.45: every method but ``_start_asgi_task`` (requests were started inline)."""
    import asyncio

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    ns = {k: v for k, v in vars(HttpToolsProtocol).items() if k not in ("_start_asgi_task", "__dict__", "__weakref__")}
    return type("WithoutStartTask", (asyncio.Protocol,), ns)


@pytest.mark.parametrize(
    ("make", "named"), [(_without_pipeline, "pipeline"), (_without_start_task, "_start_asgi_task")]
)
def test_missing_internals_choose_the_stock_protocol_with_one_warning(
    make, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    from router.http.uvicorn_compat import gateway_http, missing_internals

    fake = make()
    missing = missing_internals(fake)
    assert missing and any(named in m for m in missing), missing
    with caplog.at_level(logging.WARNING):
        chosen = gateway_http(object(), base=fake)  # type: ignore[arg-type]  # no gateway needed for the fallback
    assert chosen == "httptools"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and named in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()


def test_the_installed_uvicorn_gets_the_fast_protocol(caplog: pytest.LogCaptureFixture) -> None:
    from router.http.protocol import GatewayHttpProtocol
    from router.http.uvicorn_compat import gateway_http

    with caplog.at_level(logging.WARNING):
        chosen = gateway_http(object())  # type: ignore[arg-type]  # bound, never served here
    assert isinstance(chosen, type) and issubclass(chosen, GatewayHttpProtocol)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
