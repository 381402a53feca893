"""SGLang ``launch_server`` flags BOute emits, checked where the ``sglang`` package cannot be imported.

Source: sgl-project/sglang ``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``), names stable
since SGLang 0.3 and still present at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (2025/26 main).
``--tp-size``/``--pp-size`` also have the aliases ``--tp``/``--pp``; BOute always writes the long form.
On a GPU host with SGLang installed, ``tests/test_sglang_launcher.py`` parses the built command with
SGLang's own argument parser instead of trusting this list.
"""

from __future__ import annotations

#: flag -> takes a value (True) or is a switch (False)
SGLANG_FLAGS: dict[str, bool] = {
    "--model-path": True,
    "--served-model-name": True,
    "--host": True,
    "--port": True,
    "--tp-size": True,
    "--pp-size": True,
    "--mem-fraction-static": True,
    "--chunked-prefill-size": True,
    "--quantization": True,  # "fp8" for plan groups with dtype fp8
    "--dtype": True,
    "--context-length": True,
    "--max-running-requests": True,
    "--trust-remote-code": False,
    "--enable-metrics": False,
    "--log-level": True,
    "--api-key": True,  # BOUTE_REPLICA_TOKEN, when the deployment sets one (boute.serving.auth)
}
