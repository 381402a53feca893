"""The command line speaks one dialect: a bad value is one line on stderr and exit 2 for every command, and
``boute --help`` starts without the heavy libraries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from boute.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
PLAN = str(ROOT / "examples" / "plan-paper.json")

#: every command, each with one bad value (or a bad file) a user could type
BAD = [
    (["validate", "--scenario", "no-such-scenario.yaml"], "file not found"),
    (["validate", "--plan", "no-such-plan.json"], "file not found"),
    (["perf", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "0"], "--tp"),
    (["perf", "--model", "llama-3.1-8b", "--gpu", "no-such-gpu"], "no-such-gpu"),
    (["simulate", "--plan", PLAN, "--rate", "-1"], "--rate"),
    (["router", "train", "--profile", "builtin:gsm8k", "--out", "r.npz", "--test-fraction", "2"], "test"),
    (["router", "eval", "--profile", "builtin:gsm8k", "--router", "no-such-router.npz"], "not found"),
    (["optimize", "--out", "plan.json", "--max-evals", "0"], "--max-evals"),
    (["optimize", "--out", "plan.json", "--strategy", "annealing"], "annealing"),
    (["optimize", "--out", "plan.json", "--evaluator", "oracle"], "oracle"),
    (["experiments", "show", "no-such-experiment"], "no-such-experiment"),
    (["serve", "--plan", PLAN, "--speedup", "-1"], "--speedup"),
    (["serve", "--plan", PLAN, "--port", "0"], "--port"),
    (["verify", "--plan", PLAN, "--duration", "0"], "--duration"),
    (["verify", "--plan", PLAN, "--tol-share", "3"], "--tol-share"),
    (["verify", "--plan", PLAN, "--max-tokens", "0"], "--max-tokens"),
    (["verify", "--plan", PLAN, "--timeout", "0"], "--timeout"),
    (["verify", "--plan", PLAN, "--timeout", "-5"], "--timeout"),
    (["deploy", "up", PLAN, "--speedup", "0"], "--speedup"),
    (["deploy", "up", PLAN, "--target", "moon"], "moon"),
    (["deploy", "status", "--dir", "no-such-deployment-dir"], "nothing deployed"),
    (["deploy"], "Missing command"),
    (
        ["profile", "perf", "--endpoint", "http://127.0.0.1:9", "--model", "llama-3.1-8b", "--gpu", "h100-sxm"]
        + ["--input", "x"],
        "--input",
    ),
    (["profile", "show", "not-a-number"], "not-a-number"),
    (["no-such-command"], "no-such-command"),
]


@pytest.mark.parametrize(("argv", "says"), BAD, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(BAD)])
def test_a_bad_value_is_one_line_and_exit_2(
    argv: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # relative files and the default tracking DB land here
    with pytest.raises(SystemExit) as done:
        main([*argv, "--db", f"sqlite:///{tmp_path / 't.db'}"] if argv[:2] == ["experiments", "show"] else argv)
    out, err = capsys.readouterr()
    assert done.value.code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err


@pytest.mark.timeout(120)  # starts processes
def test_help_starts_light() -> None:
    """`boute --help` and a command's --help import none of the heavy libraries (measured by what is imported,
    not by a clock: the machine may be busy)."""
    heavy = ("torch", "botorch", "gpytorch", "fastapi", "sklearn", "scipy", "matplotlib", "sqlalchemy", "ray")
    for argv in (["--help"], ["optimize", "--help"], ["serve", "--help"]):
        r = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "boute", *argv], capture_output=True, text=True, check=False
        )
        assert r.returncode == 0, r.stderr[-500:]
        imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
        assert not imported & set(heavy), (argv, sorted(imported & set(heavy)))


@pytest.mark.timeout(120)  # starts a process
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_long_running_commands_stop_on_signals_even_when_started_with_sigint_ignored(sig: str) -> None:
    """A shell starts background jobs with SIGINT ignored; `boute serve`/`boute replan` must still stop on
    `kill -INT` (and unwind on SIGTERM) instead of running on."""
    import signal

    from tests.waits import SAFETY_S

    code = (
        "import sys, time\n"
        "from boute.cli.signals import stop_signals\n"
        "try:\n"
        "    with stop_signals():\n"
        "        print('ready', flush=True)\n"  # the event: the handlers are in place
        "        time.sleep(30)\n"
        "except KeyboardInterrupt as exc:\n"
        "    print('stopped', type(exc).__name__, flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `cmd &` in a script
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(getattr(signal, sig))
    out, _ = proc.communicate(timeout=SAFETY_S)
    assert proc.returncode == 0
    assert out.strip() == ("stopped KeyboardInterrupt" if sig == "SIGINT" else "stopped Terminated")
