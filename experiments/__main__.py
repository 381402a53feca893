"""``python -m experiments [NAME ...] [--quick | --tiny] [--seed K] [--db URL] [--out DIR]``.

No names: every experiment in order, then ``results/README.md``. ``--quick`` finishes in minutes on a
shared 2-core machine; ``--tiny`` is the smoke-test size the test suite uses. Heavy libraries load inside
the experiments, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import warnings
from pathlib import Path

from experiments import EXPERIMENTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments", description="Reproduce the BOute evaluation.")
    ap.add_argument("names", nargs="*", help=f"experiments to run (default: all of {', '.join(EXPERIMENTS)})")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller settings: minutes instead of an hour")
    size.add_argument("--tiny", action="store_true", help="smoke-test settings (what the tests run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=None, help="tracking DB URL (default sqlite:///experiments/results/experiments.db)")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default experiments/results)")
    ap.add_argument("--report-only", action="store_true", help="only regenerate results/README.md")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        print(
            f"python -m experiments: unknown experiment '{unknown[0]}' (known: {', '.join(EXPERIMENTS)})",
            file=sys.stderr,
        )
        return 2
    from experiments.common import RESULTS, Context

    preset = "tiny" if args.tiny else "quick" if args.quick else "full"
    command = " ".join(["python -m experiments", *(argv if argv is not None else sys.argv[1:])])
    ctx = Context(preset=preset, seed=args.seed, results=args.out or RESULTS, db=args.db, command=command)
    warnings.filterwarnings("ignore")
    try:
        if not args.report_only:
            import torch

            torch.set_num_threads(1)
            for name in args.names or EXPERIMENTS:
                t0 = time.perf_counter()
                importlib.import_module(f"experiments.{name}").run(ctx)
                print(f"[experiments] {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
        from experiments.report import write_readme

        print(f"[experiments] wrote {write_readme(ctx.results)}", flush=True)
    finally:
        ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
