"""SGLang's own code as the judge of what BOute sends it and of what the emulated backend answers in its name.

Runs where SGLang's code is importable (the contract install of ``build.py`` on ``PYTHONPATH``), as a child
process of the tests: ``python -m backends.sglang.contract < job.json > verdicts.json``. Two checks:

- :func:`parse_argvs`: each launcher argv (the part after ``-m sglang.launch_server``) through SGLang's
  ``prepare_server_args``, the function ``launch_server`` itself calls; the parsed ``ServerArgs`` come back as a
  dict, or the parser's own error; with them the argv's flags that SGLang's parser takes without a value (its
  ``store_true`` flags, such as ``--enable-cache-report``), so the tests pair flags with values as SGLang does.
- :func:`validate`: each payload through one of SGLang's OpenAI protocol models
  (``sglang.srt.entrypoints.openai.protocol``). A verdict lists pydantic's errors (``field.path: message``) and
  the *unknown* fields: keys the payload has that the model does not define (its models ignore extra keys, so
  validation alone would never see a field SGLang does not have).
- :func:`usages`: the ``usage`` SGLang's own ``UsageProcessor`` (``entrypoints/openai/usage_processor.py``) makes
  of one request's ``meta_info`` counts (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``), whole or
  streamed, with ``--enable-cache-report`` on or off: what the emulated backend's usage must equal.

SGLang's package ``__init__`` is not executed (:func:`_sglang_without_init`): it patches transformers and
imports the frontend language; neither the parser nor the protocol models need it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import sys
import types
from typing import Any

#: protocol models a payload may name (the OpenAI surface the emulated backend speaks)
MODELS = (
    "ChatCompletionRequest",
    "CompletionRequest",
    "ChatCompletionResponse",
    "CompletionResponse",
    "ChatCompletionStreamResponse",
    "CompletionStreamResponse",
    "ErrorResponse",
    "ModelList",
    "UsageInfo",
    "PromptTokensDetails",
)


def _sglang_without_init() -> None:
    """Make ``import sglang.X`` work without running ``sglang/__init__.py`` (a bare package module)."""
    if "sglang" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not importable (run `make sglang-contract`)")
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["sglang"] = pkg


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


@functools.cache
def _zero_arity_flags() -> frozenset[str]:
    """Every flag SGLang's parser (built as ``prepare_server_args`` builds it) takes no value for."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    actions = parser._option_string_actions  # argparse's own map; its public API has no per-flag arity
    return frozenset(flag for flag, action in actions.items() if action.nargs == 0)


def _bare_flags(argv: list[str]) -> list[str]:
    """The flags of ``argv`` that SGLang's parser takes no value for."""
    return [a for a in argv if a in _zero_arity_flags()]


def parse_argvs(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Each argv through ``prepare_server_args``: ``{"ok": True, "args": {field: value}, "bare": [flag, ...]}`` or
    the parser's error."""
    _sglang_without_init()
    from sglang.srt.server_args import prepare_server_args

    out: list[dict[str, Any]] = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(list(argv))
        except SystemExit:
            lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
            out.append({"ok": False, "error": lines[-1] if lines else "the parser exited"})
            continue
        except Exception as exc:  # a value the parser takes but ServerArgs refuses
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        # ServerArgs is a msgspec Struct (0.5.2x): its fields are __struct_fields__, not __dict__
        fields = getattr(args, "__struct_fields__", None) or tuple(vars(args))
        args_out = {k: _jsonable(getattr(args, k)) for k in fields}
        out.append({"ok": True, "args": args_out, "bare": _bare_flags(list(argv))})
    return out


def unknown_fields(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Paths of keys in ``sent`` that the validated model dropped (``kept`` is its ``model_dump``)."""
    found: list[str] = []
    if isinstance(sent, dict) and isinstance(kept, dict):
        for k, v in sent.items():
            where = f"{path}.{k}" if path else str(k)
            if k not in kept:
                found.append(where)
            else:
                found += unknown_fields(v, kept[k], where)
    elif isinstance(sent, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(sent, kept, strict=False)):
            found += unknown_fields(a, b, f"{path}[{i}]")
    return found


def validate(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``{"model": NAME, "data": {...}}`` through SGLang's protocol model NAME: errors and unknown fields."""
    _sglang_without_init()
    import pydantic
    from sglang.srt.entrypoints.openai import protocol

    out: list[dict[str, Any]] = []
    for p in payloads:
        name = p["model"]
        if name not in MODELS:
            out.append({"errors": [f"no such protocol model here: {name}"], "unknown": []})
            continue
        model = getattr(protocol, name)
        try:
            obj = model.model_validate(p["data"])
        except pydantic.ValidationError as exc:
            errors = [f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()]
            out.append({"errors": errors, "unknown": []})
            continue
        out.append({"errors": [], "unknown": unknown_fields(p["data"], obj.model_dump())})
    return out


def usages(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``{"meta_info": {...}, "enable_cache_report": bool, "stream": bool}`` through SGLang's usage code, as
    its serving_chat/serving_completions call it for one choice; the usage as SGLang's responses carry it."""
    _sglang_without_init()
    from sglang.srt.entrypoints.openai.usage_processor import UsageProcessor

    out: list[dict[str, Any]] = []
    for j in jobs:
        meta, report = j["meta_info"], bool(j["enable_cache_report"])
        if j.get("stream"):
            counts = [{0: int(meta.get(k, 0))} for k in ("prompt_tokens", "reasoning_tokens", "completion_tokens")]
            cached = {0: int(meta.get("cached_tokens", 0))}
            usage = UsageProcessor.calculate_streaming_usage(*counts, cached, n_choices=1, enable_cache_report=report)
        else:
            usage = UsageProcessor.calculate_response_usage([{"meta_info": meta}], 1, enable_cache_report=report)
        out.append(json.loads(usage.model_dump_json()))
    return out


def main() -> int:
    job = json.load(sys.stdin)
    verdicts = {
        "argvs": parse_argvs(job.get("argvs", [])),
        "payloads": validate(job.get("payloads", [])),
        "usages": usages(job.get("usages", [])),
    }
    json.dump(verdicts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
