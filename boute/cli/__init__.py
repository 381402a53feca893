"""Command-line interface (Typer): one module per command group."""
