"""SGLang replicas: the launch command for a plan replica group (run it under backends.supervisor)."""

from backends.sglang.command import BARE_FLAGS, SGLangOptions, argv_flags, place_plan, replica_spec, sglang_argv

__all__ = ["BARE_FLAGS", "SGLangOptions", "argv_flags", "place_plan", "replica_spec", "sglang_argv"]
