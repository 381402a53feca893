"""Continuous batching on a modelled clock: why the emulated backend slows down under load like SGLang.

One scheduler task runs iterations, as SGLang's scheduler does by default (no mixed batches) and as the
simulator models it (docs/simulator.md): when waiting requests can be admitted (their whole KV footprint,
prompt + answer, fits the replica's modelled KV pool and the running-request cap), the iteration prefills
them, up to ``chunk_tokens`` of prompt (at least one request), and their first tokens come out of it; the
running sequences wait. Otherwise it is one decode step of every running sequence, one token each. An
iteration lasts ``prefill_time`` or ``decode_step_time`` from the perf model, divided by ``speedup``; the
clock is absolute so event-loop jitter does not accumulate. More concurrent requests -> bigger decode
batches -> longer steps -> slower tokens; more arrivals -> more prefill iterations that stall decoding; a
full pool -> queueing. Before, every iteration prefilled *and* decoded: on MT-Bench (270-token prompts at
94 req/s) running answers never waited for a prefill, and a pre-routed plan measured a P95 22% below the
simulator's 9.3 s.

**Prefix cache.** Each engine keeps SGLang's radix cache as :class:`boute.perf.prefix_cache.PrefixCache` over
the prompt's token pieces (:func:`boute.perf.prefix_cache.token_path`). At admission a request matches its
longest cached prefix (``Sequence.cached``, what SGLang reports as ``cached_tokens``); only the rest is
prefilled and counts against ``chunk_tokens``, while attention still reads the cached prefix
(:meth:`Engine.prefill_seconds`). As SGLang (``checkpoint_kv_cache`` after a prefill, ``release_kv_cache``
with ``checkpoint=True`` when a request ends, ``mem_cache/common.py``), the prompt is inserted once
prefilled, and prompt + answer when the sequence ends, up to the tokens whose KV was computed (every answer
token but the last, ``Req.owned_kv_len``); a request cancelled while running ends the same way (SGLang
aborts it through its finish path), one cancelled while waiting computed nothing and inserts nothing.

The tree shares the pool with the running requests: it holds every prompt prefilled (a running request's
own included, as SGLang's locked nodes) and is held to the pool less the answers the running requests
reserve (``cache_tokens`` caps it lower, for tests). Admission reserves a request's uncached prompt tokens
and its answer (SGLang's ``PrefillAdder`` counts the extend length + max new tokens): a hit saves prefill time
and admission room. The simulator keeps the same budgets (:mod:`boute.sim.replica`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from boute.perf import ReplicaPerf
from boute.perf.physics import step_time
from boute.perf.prefix_cache import PrefixCache, Segment, token_path
from boute.sim.timing import DEFAULT_CHUNK_TOKENS

#: how far (seconds, real time) the modelled clock may lag before it is reset instead of caught up
MAX_LAG_S = 0.05


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine: the pieces (tokens) it will emit and where they go; ``prompt`` its
    prompt's pieces and ``path`` their prefix-cache path (empty: not cached), ``cached`` the prompt tokens the
    cache held at admission."""

    pieces: list[str]
    input_tokens: int
    stream: asyncio.Queue[str | None] | None
    done: asyncio.Future[None]
    prompt: tuple[str, ...] = ()
    path: list[Segment] = field(default_factory=list)
    cached: int = 0
    emitted: int = 0
    cancelled: bool = False
    arrived: float = field(default_factory=time.monotonic)
    first_token_at: float = 0.0

    @property
    def output_tokens(self) -> int:
        return len(self.pieces)

    def text(self) -> str:
        return "".join(self.pieces[: self.emitted])


class Engine:
    def __init__(
        self,
        perf: ReplicaPerf,
        speedup: float = 1.0,
        max_running: int = 256,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        cache_tokens: int | None = None,
    ) -> None:
        if not perf.fits:
            raise ValueError(f"replica does not fit: {perf.reason}")
        self.perf = perf
        self.speedup = speedup
        self.max_running = max_running
        self.chunk_tokens = chunk_tokens
        self.kv_capacity = perf.kv_capacity_tokens
        self.cache_tokens = self.kv_capacity if cache_tokens is None else min(cache_tokens, self.kv_capacity)
        self.cache = PrefixCache(self.cache_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_used = 0
        self.answers_reserved = 0  # answer tokens the running requests reserve (not in the tree until they end)
        self.iterations = 0
        self.tokens_out = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="emulated-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, pieces: list[str], input_tokens: int, stream: bool, prompt: tuple[str, ...] = ()) -> Sequence:
        """Queue a request emitting ``pieces``; ``prompt`` (its ``input_tokens`` pieces) puts it through the
        prefix cache, without it the whole prompt is prefilled and nothing is cached."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] | None = asyncio.Queue() if stream else None
        seq = Sequence(pieces or [""], max(1, input_tokens), queue, loop.create_future(), prompt, token_path(prompt))
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """The client went away: the sequence leaves the batch at the next iteration."""
        seq.cancelled = True

    # ---- scheduler ----------------------------------------------------------------------------
    def _emit(self, seq: Sequence) -> None:
        piece = seq.pieces[seq.emitted]
        seq.emitted += 1
        self.tokens_out += 1
        if seq.stream is not None:
            seq.stream.put_nowait(piece)

    def _finish(self, seq: Sequence) -> None:
        self.kv_used -= seq.input_tokens - seq.cached + seq.output_tokens
        self.answers_reserved -= seq.output_tokens
        self.cache.limit(self.cache_tokens - self.answers_reserved)
        if seq.path:  # what has KV: the prompt and every answer token but the last (module docstring)
            self.cache.insert(token_path(seq.prompt + tuple(seq.pieces[: max(0, seq.emitted - 1)])))
        if seq.stream is not None:
            seq.stream.put_nowait(None)
        if not seq.done.done():
            seq.done.set_result(None)

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        prompt = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            seq = self.waiting[0]
            if seq.cancelled:
                self.waiting.popleft()
                if not seq.done.done():
                    seq.done.set_result(None)
                continue
            new = seq.input_tokens - self.cache.peek(seq.path, seq.input_tokens)
            if self.kv_used + new + seq.output_tokens > self.kv_capacity and (self.running or admitted):
                break  # wait for memory; a lone oversized request still runs (SGLang would chunk it)
            if admitted and prompt + new > self.chunk_tokens:
                break  # the rest goes in the next prefill iteration (a hit is not prefilled: not counted)
            self.waiting.popleft()
            seq.cached = self.cache.match(seq.path, seq.input_tokens) if seq.path else 0
            prompt += seq.input_tokens - seq.cached
            self.kv_used += seq.input_tokens - seq.cached + seq.output_tokens
            self.answers_reserved += seq.output_tokens
            admitted.append(seq)
        if admitted:
            self.cache.limit(self.cache_tokens - self.answers_reserved)
        return admitted

    def prefill_seconds(self, admitted: list[Sequence]) -> float:
        """Modelled seconds of one prefill iteration: each prompt's uncached ``u`` tokens are computed, and
        they attend to its ``h`` cached tokens too. The perf model's attention term is ``2 sq + 4 ctx`` (a
        query-key pair costs 4: ``sq = u^2`` for the causal part, ``ctx`` for keys read once per query in
        decode); the pairs ``u h`` go in as ``ctx = h`` (which also charges reading the prefix's KV once) and
        ``sq = u^2 + 2 h (u - 1)``, so the attention is exactly ``2 u^2 + 4 u h``. Without hits this is
        ``ReplicaPerf.prefill_time`` of the prompts."""
        new = [s.input_tokens - s.cached for s in admitted]
        hit = [s.cached for s in admitted]
        sq = sum(u * u + 2 * h * (u - 1) for u, h in zip(new, hit, strict=True))
        perf = self.perf
        return float(step_time(perf.rates, perf.shape, sum(new), sum(hit), sq, seqs=len(admitted)))

    def iteration_time(self, admitted: list[Sequence], decoding: list[Sequence]) -> float:
        t = 0.0
        if admitted:
            t += self.prefill_seconds(admitted)
        if decoding:
            ctx = sum(s.input_tokens + s.emitted for s in decoding)
            t += float(self.perf.decode_step_time(len(decoding), ctx))
        return t

    async def _loop(self) -> None:
        clock = time.monotonic()
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                clock = time.monotonic()
            for seq in [s for s in self.running if s.cancelled]:
                self.running.remove(seq)
                self._finish(seq)
            admitted = self._admit()
            decoding = [] if admitted else list(self.running)  # a prefill iteration decodes nothing
            if not admitted and not decoding:
                continue
            clock += self.iteration_time(admitted, decoding) / self.speedup
            now = time.monotonic()
            if clock < now - MAX_LAG_S:
                clock = now
            await asyncio.sleep(max(0.0, clock - now))
            self.iterations += 1
            for seq in admitted:  # prefill yields the first token, and the prompt's KV goes in the tree
                seq.first_token_at = time.monotonic()
                if seq.path:
                    self.cache.insert(seq.path)
                self._emit(seq)
                self.running.append(seq)
            still: list[Sequence] = []
            for seq in self.running:
                if not admitted and not seq.cancelled and seq.emitted < seq.output_tokens:  # a decode step
                    self._emit(seq)
                if seq.cancelled or seq.emitted >= seq.output_tokens:
                    self._finish(seq)
                else:
                    still.append(seq)
            self.running = still
