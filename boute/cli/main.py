"""The ``boute`` command line.

Each sub-command lives in its own module and imports its heavy dependencies (torch, botorch, fastapi)
inside the command body, so ``boute --help`` and light commands start fast. User mistakes surface as
:class:`~boute.errors.BouteError`: one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from boute.errors import BouteError

app = typer.Typer(
    name="boute",
    help="BOute: co-optimise LLM query routing and heterogeneous GPU deployment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """BOute: co-optimise LLM query routing and heterogeneous GPU deployment."""


def _register() -> None:
    # One line per command module; each module exposes `register(app)`.
    from boute.cli import (
        deploy_cmd,
        experiments_cmd,
        optimize_cmd,
        perf_cmd,
        profile_cmd,
        replan_cmd,
        report_cmd,
        router_cmd,
        serve_cmd,
        simulate_cmd,
        validate_cmd,
        verify_cmd,
    )

    # listed in the order a user meets them: specs -> models -> optimiser -> serving -> deployment
    for module in (
        validate_cmd,
        perf_cmd,
        simulate_cmd,
        router_cmd,
        optimize_cmd,
        experiments_cmd,
        report_cmd,
        serve_cmd,
        verify_cmd,
        deploy_cmd,
        replan_cmd,
        profile_cmd,
    ):
        module.register(app)


def _plug_in() -> None:
    """The deployment side's implementations of core registries (the core never imports ``backends``)."""
    from boute.optimize.registry import EVALUATORS

    EVALUATORS.register(
        "live", "backends.deploy.live_eval:LiveEvaluator", "deploy emulated replicas, replay, measure", fidelity=2
    )


_plug_in()
_register()


#: Click's (vendored by Typer) base of every command-line mistake: bad value, unknown option, missing argument
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _usage_message(exc: Exception) -> str:
    """Click's one-line text of a usage error (``format_message`` names the option of a bad value)."""
    fmt = getattr(exc, "format_message", None)
    return str(fmt()) if callable(fmt) else str(exc)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app. A user mistake, be it a bad option value (Click's usage errors) or a bad
    file (a BouteError), is one line on stderr and exit code 2, never a traceback or a box of text."""
    try:
        code = app(args=argv, standalone_mode=False)
    except _USAGE_ERROR as exc:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        typer.echo(f"error: {where}{_usage_message(exc)}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except BouteError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
