"""Timeouts the gateway and the profiler share, in a module of constants so ``import router`` stays light.

The gateway's settings (``router.config``) need only the number; importing it from where judges are built
(:mod:`boute.quality.judges`) pulled in the whole quality package (~0.3 s) on a bare ``import router``.
"""

from __future__ import annotations

#: seconds an LLM judge call may take before it scores 0.0 (escalate): the gateway's default
#: (``BOUTE_JUDGE_TIMEOUT_S``), and the profiler's, so a judge too slow to serve is profiled as failing
JUDGE_TIMEOUT_S = 10.0
