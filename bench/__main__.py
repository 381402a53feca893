"""Run every benchmark module and write ``bench/results/<name>.json`` plus a summary README.

``python -m bench [NAME ...] [--quick]``: each ``bench/bench_<name>.py`` exposes ``run(quick) -> dict``
returning JSON-serialisable figures (include the goal beside each measured figure where an issue sets one).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    wanted = [a for a in argv if not a.startswith("--")]
    names = sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if m.name.startswith("bench_")
    )
    if wanted:
        names = [n for n in names if n in wanted]
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in names:
        mod = importlib.import_module(f"bench.bench_{name}")
        t0 = time.perf_counter()
        load_before = os.getloadavg()  # the cores are shared: a busy machine explains slow figures
        print(f"[bench] {name} ...", flush=True)
        result = mod.run(quick=quick)
        meta = {
            "benchmark": name,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}",
            "quick": quick,
            "wall_s": round(time.perf_counter() - t0, 2),
            "command": "python -m bench " + " ".join(argv),
            "load_avg_1_5_15_before": [round(x, 2) for x in load_before],
            "load_avg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        }
        out = RESULTS / f"{name}.json"
        out.write_text(json.dumps({"meta": meta, "results": result}, indent=2, default=float) + "\n")
        print(f"[bench] {name}: wrote {out} ({meta['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
