"""The readers of each quality-profile format (:mod:`boute.quality.profiles` documents the formats).

One function per format, ``(path, shown name, scale) -> QualityProfile``, registered in :data:`READERS` under
the format's name; :func:`boute.quality.profiles.load_profile` picks one. Every validation error names the
file, the line (or column) and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from boute.quality.csv_profiles import RB_COST, RB_RESPONSE, read_routellm_csv, read_routerbench
from boute.quality.jsonl_profiles import read_jsonl
from boute.quality.mtbench_profiles import mtbench_prompt_response, read_mtbench
from boute.quality.profile_cells import jsonl_records
from boute.quality.profiles import FORMATS, QualityProfile

# re-exported from their modules: profiles.py, the profiler (backends/profile) and the tests import them from here
__all__ = ["READERS", "RB_COST", "RB_RESPONSE", "jsonl_records", "mtbench_prompt_response"]


#: format name -> reader
READERS: dict[str, Callable[[Path, str, tuple[float, float] | None], QualityProfile]] = {
    "routellm-csv": read_routellm_csv,
    "routerbench": read_routerbench,
    "mtbench-jsonl": read_mtbench,
    "jsonl": read_jsonl,
}
assert set(READERS) == set(FORMATS)
