"""SGLang replicas: the launch command for a plan replica group (run it under backends.supervisor)."""

from backends.sglang.command import SGLangOptions, place_plan, replica_spec, sglang_argv

__all__ = ["SGLangOptions", "place_plan", "replica_spec", "sglang_argv"]
