"""Reproductions of the BOute paper's evaluation (issue 7): ``python -m experiments [NAME ...] [--quick]``.

One module per experiment, each exposing ``run(ctx: Context) -> dict``: ``main_comparison``, ``scaling``,
``ablations``, ``sensitivity``, ``cost`` (cost at equal performance, issue 12); ``cascadia`` is the bi-level
baseline the comparisons use. Results land
in ``experiments/results/`` (JSON, markdown, PNG; ``README.md`` is generated from them) and in the tracking DB.
"""

EXPERIMENTS = ("main_comparison", "scaling", "ablations", "sensitivity", "cost")
