"""Benchmarks (``make bench``): each module ``bench/bench_*.py`` exposes ``run(quick: bool) -> dict``."""
