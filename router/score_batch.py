"""One scorer call per event-loop turn: the gateway's batching of prompt scoring."""

from __future__ import annotations

import asyncio
from typing import Any


class ScoreBatcher:
    """Collects the prompts of one event-loop turn and scores them with one ``scorer.score`` call.

    Why: a static-embedding router's per-prompt cost is mostly fixed overhead (tokenizer call, numpy calls);
    batched, that is paid once per loop turn, and under load a turn brings many requests. A lone prompt waits
    for nothing but the end of the current turn. ``score`` of a batch equals ``score_one`` per prompt up to
    float rounding (~1e-16), and thresholds are cut on batched scores of the reference anyway.
    """

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.loop = asyncio.get_running_loop()
        self.pending: list[tuple[str, asyncio.Future[float]]] = []

    def submit(self, prompt: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = self.loop.create_future()
        if not self.pending:
            self.loop.call_soon(self._flush)
        self.pending.append((prompt, fut))
        return fut

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        try:
            scores = [float(x) for x in self.scorer.score([p for p, _ in batch])]
        except Exception:  # one bad prompt must not fail the others: score them one by one
            for p, f in batch:
                if not f.done():
                    try:
                        f.set_result(float(self.scorer.score([p])[0]))
                    except Exception as exc:
                        f.set_exception(exc)
            return
        for (_, f), sc in zip(batch, scores, strict=True):
            if not f.done():
                f.set_result(sc)
