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
        router_cmd,
        serve_cmd,
        simulate_cmd,
        validate_cmd,
    )

    # listed in the order a user meets them: specs -> models -> optimiser -> serving -> deployment
    for module in (
        validate_cmd,
        perf_cmd,
        simulate_cmd,
        router_cmd,
        optimize_cmd,
        experiments_cmd,
        serve_cmd,
        deploy_cmd,
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


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; a BouteError becomes one line on stderr and exit code 2."""
    try:
        app(args=argv)
    except BouteError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
