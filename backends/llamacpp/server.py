"""``python -m backends.llamacpp.server ARGS``: llama-cpp-python's server plus an SGLang-style ``GET /health``.

Why a wrapper: the BOute gateway and the supervisor probe ``/health`` (SGLang's readiness URL); the stock
``python -m llama_cpp.server`` has none. This builds the very same app from the same command-line flags
(``--model``, ``--n_ctx``, ``--n_threads``, ``--model_alias``, ...) and adds one route that answers 200
once the model is loaded (the app is created after loading, so answering at all means ready).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    parser = argparse.ArgumentParser(prog="python -m backends.llamacpp.server", description=__doc__)
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    server = parse_model_from_args(ServerSettings, args)
    model = parse_model_from_args(ModelSettings, args)
    app = create_app(server_settings=server, model_settings=[model])

    @app.get("/health", include_in_schema=False)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host=server.host, port=server.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
