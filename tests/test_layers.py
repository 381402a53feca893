"""The import contracts of ``make lint`` (pyproject.toml ``[tool.importlinter]``) hold, and catch what they are for.

Each case copies the project's Python sources into a temporary tree, plants one import that breaks a rule
(a back-import against the core's layer order, a type-only one, a circle inside a package, the core
importing the gateway), and runs ``lint-imports`` with the project's own configuration on the copy: the run
must fail and name the contract. The untouched copy must pass, so a failure is the planted line's doing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("boute", "router", "backends", "experiments")
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed in this environment")


def _copy_sources(dest: Path) -> None:
    """The packages' Python files (no data, no caches): all import-linter reads."""
    for pkg in PACKAGES:
        for src in (ROOT / pkg).rglob("*.py"):
            out = dest / src.relative_to(ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
    shutil.copyfile(ROOT / "pyproject.toml", dest / "pyproject.toml")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the copy's packages, not the installed project's
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("pristine")
    _copy_sources(tree)
    return tree


@pytest.mark.timeout(300)
def test_the_project_keeps_every_contract(pristine: Path) -> None:
    run = _lint(pristine)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


PLANTED = [
    # a lower layer importing a higher one: the data model importing the optimiser
    ("boute/specs/io.py", "import boute.optimize.trials  # noqa", "the core is layered"),
    # the same, for types only: a back-import is one whatever it is for
    (
        "boute/perf/model.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from boute.serving.bundle import write_plan  # noqa",
        "the core is layered",
    ),
    # the core reaching into the gateway
    ("boute/sim/engine.py", "import router.gateway  # noqa", "the core imports neither router nor backends"),
    # a circle inside one package: the optimiser's space importing its loop, which imports the space
    ("boute/optimize/space.py", "import boute.optimize.loop  # noqa", "no import circles"),
    # a circle in the gateway
    ("router/config.py", "import router.app  # noqa", "no import circles"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("module", "line", "contract"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_import_breaks_its_contract(
    pristine: Path, tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree)
    _plant(tree, module, line)
    run = _lint(tree)
    assert run.returncode != 0, f"planting {line!r} in {module} left every contract kept:\n{run.stdout[-2000:]}"
    broken = run.stdout[run.stdout.find("Broken contracts") :]
    assert contract in broken, broken[-3000:]
