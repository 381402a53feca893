"""``python -m boute ...``: the same CLI as the ``boute`` script, for hosts where only the interpreter is on PATH."""

from boute.cli.main import main

main()
