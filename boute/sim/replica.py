"""One serving replica under SGLang-style continuous batching, advanced in closed-form jumps.

Scheduling at every iteration boundary (SGLang's default, no mixed prefill/decode batches):

1. *Prefill first*: if a chunked prompt is in progress, or the head of the FCFS queue can be admitted,
   run one prefill iteration of up to ``chunk`` tokens (FCFS, the last prompt may be split). A request is
   admitted only if its prompt + output tokens fit in the free KV tokens (reserved until it finishes, so
   there is no preemption) and the running cap allows; otherwise it and everyone behind it wait.
   The prefill iteration emits each finished prompt's first token.
2. Otherwise, *decode*: every running sequence emits one token per step. Between events the batch is
   fixed, so the replica jumps straight to the next completion (``ReplicaTiming.decode``); an arrival
   that can be admitted cuts the jump at the first step boundary after it.

The replica only keeps aggregate state (batch size, total context, a heap of finishing step numbers),
so an event costs O(log batch) regardless of how many tokens it covers.

Prefix cache (when the workload's prompts share prefixes, :mod:`boute.workload.prefixes`): at admission a
request's longest cached prefix (:class:`boute.perf.prefix_cache.PrefixCache`) is neither prefilled nor
reserved again, so its prefill covers tokens ``hit .. input`` (attention over the cached part included)
and its KV reservation is ``input - hit + output`` (SGLang's ``PrefillAdder``: extend length + new tokens).
Its prompt is cached when its prefill completes, its prompt and answer when it finishes; the cache is held
to the pool less the answers the running requests reserve (it holds their prompts, as SGLang's locked
nodes). The emulated backend keeps the same two budgets (``backends/emulated/engine.py``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from boute.sim.timing import ReplicaTiming

if TYPE_CHECKING:
    from boute.perf.prefix_cache import PrefixCache, Segment
    from boute.workload.prefixes import Paths

IDLE, PREFILL, DECODE = 0, 1, 2


class SimReplica:
    """Mutable simulation state of one replica; the engine owns the clock and the event heap."""

    __slots__ = (
        "index",
        "tier",
        "group",
        "timing",
        "weight",
        "now",
        "plan",
        "plan_end",
        "plan_k",
        "plan_items",
        "version",
        "waiting",
        "partial",
        "partial_done",
        "batch",
        "ctx",
        "steps",
        "finishing",
        "kv_used",
        "outstanding",
        "served",
        "busy_s",
        "cache",
        "paths",
        "cached",
        "answers",
    )

    def __init__(self, index: int, tier: int, group: int, timing: ReplicaTiming, weight: float) -> None:
        self.index = index
        self.tier = tier
        self.group = group
        self.timing = timing
        self.weight = weight
        self.now = 0.0  # state below is exact at this time (an iteration boundary)
        self.plan = IDLE
        self.plan_end = 0.0
        self.plan_k = 0
        self.plan_items: list[tuple[int, int, bool]] = []  # prefill: (request, tokens, prompt done)
        self.version = 0
        self.waiting: deque[int] = deque()
        self.partial = -1  # request whose prompt is being prefilled in chunks
        self.partial_done = 0
        self.batch = 0  # running (decoding) sequences
        self.ctx = 0.0  # their total context tokens
        self.steps = 0  # decode steps taken so far
        self.finishing: list[tuple[int, int]] = []  # heap of (step at which it finishes, request)
        self.kv_used = 0
        self.outstanding = 0  # requests assigned and not finished
        self.served = 0
        self.busy_s = 0.0
        # the prefix cache (boute.perf.prefix_cache), set by the engine when the workload's prompts share
        # prefixes: ``cached[rid]`` is the hit of request rid at its current replica
        self.cache: PrefixCache | None = None
        self.paths: Paths | None = None
        self.cached: list[int] = []
        self.answers = 0  # answer tokens the running requests reserve (not in the cache until they end)

    def can_admit(self, need: int) -> bool:
        return self.kv_used + need <= self.timing.kv_capacity and self.batch < self.timing.max_running

    def schedule(self, inp: list[int], out: list[int]) -> None:
        """Choose the next iteration at ``self.now`` (prefill first) and set ``plan``/``plan_end``."""
        tm = self.timing
        items: list[tuple[int, int, bool]] = []
        budget = tm.chunk
        tokens = 0
        sq = 0.0
        admitted = self.batch
        if self.partial >= 0:
            rid, done = self.partial, self.partial_done
            take = min(budget, inp[rid] - done)
            sq += float(done + take) ** 2 - float(done) ** 2
            items.append((rid, take, done + take >= inp[rid]))
            tokens += take
            budget -= take
            admitted += 1
        waiting = self.waiting
        cap = tm.max_running
        kv_cap = tm.kv_capacity
        while waiting and budget > 0 and admitted < cap:
            rid = waiting[0]
            need = inp[rid] + out[rid]
            if self.kv_used + need > kv_cap:
                break
            waiting.popleft()
            hit = self._match(rid, inp[rid], out[rid]) if self.cache is not None else 0
            self.kv_used += need - hit
            take = min(budget, inp[rid] - hit)
            sq += float(hit + take) ** 2 - float(hit) * hit
            items.append((rid, take, hit + take >= inp[rid]))
            tokens += take
            budget -= take
            admitted += 1
        if items:
            self.plan = PREFILL
            self.plan_items = items
            dur = tm.prefill(tokens, sq, len(items))
            self.plan_end = self.now + dur
            self.busy_s += dur
        elif self.batch:
            k = self.finishing[0][0] - self.steps
            self.plan = DECODE
            self.plan_k = k
            self.plan_end = self.now + tm.decode(self.batch, self.ctx, k)
        else:
            self.plan = IDLE
        self.version += 1

    def finish_plan(self, inp: list[int], out: list[int], ttft: list[float], done: list[int]) -> None:
        """Apply the planned iteration(s) at ``plan_end``; finished requests are appended to ``done``."""
        end = self.plan_end
        if self.plan == PREFILL:
            previous = self.partial
            self.partial = -1
            for rid, take, complete in self.plan_items:
                if not complete:
                    start = (
                        self.partial_done if rid == previous else (self.cached[rid] if self.cache is not None else 0)
                    )
                    self.partial_done = start + take
                    self.partial = rid
                    continue
                if self.cache is not None:
                    self._store(self.paths.prompt(rid))  # type: ignore[union-attr]
                ttft[rid] = end
                remaining = out[rid] - 1
                if remaining <= 0:
                    self._complete(rid, inp, out, done)
                else:
                    heapq.heappush(self.finishing, (self.steps + remaining, rid))
                    self.batch += 1
                    self.ctx += inp[rid] + 1
            self.plan_items = []
        elif self.plan == DECODE:
            self.busy_s += end - self.now
            k = self.plan_k
            self.steps += k
            self.ctx += self.batch * k
            fin = self.finishing
            while fin and fin[0][0] <= self.steps:
                _, rid = heapq.heappop(fin)
                self.batch -= 1
                self.ctx -= inp[rid] + out[rid]
                self._complete(rid, inp, out, done)
        self.now = end

    def _match(self, rid: int, prompt_tokens: int, answer_tokens: int) -> int:
        """The cached prefix of request ``rid``'s prompt (``prompt_tokens`` long: its path's tokens), which it
        then neither prefills nor reserves again; its answer is reserved beside the cache."""
        hit = self.cache.match(self.paths.prompt(rid), prompt_tokens)  # type: ignore[union-attr]
        self.cached[rid] = hit
        self.answers += answer_tokens
        self.cache.limit(self.timing.kv_capacity - self.answers)  # type: ignore[union-attr]
        return hit

    def _store(self, path: tuple[Segment, ...]) -> None:
        """Cache ``path`` within the KV pool less the answers the running requests reserve: the cache holds
        the running prompts (SGLang's locked nodes) and everything finished, the answers are apart."""
        cache = self.cache
        cache.insert(path)  # type: ignore[union-attr]
        cache.limit(self.timing.kv_capacity - self.answers)  # type: ignore[union-attr]

    def _complete(self, rid: int, inp: list[int], out: list[int], done: list[int]) -> None:
        if self.cache is not None:
            self.kv_used -= inp[rid] + out[rid] - self.cached[rid]
            self.answers -= out[rid]
            self._store(self.paths.full(rid, self.tier, out[rid]))  # type: ignore[union-attr]
        else:
            self.kv_used -= inp[rid] + out[rid]
        self.outstanding -= 1
        self.served += 1
        done.append(rid)

    def cut_decode(self, t: float) -> bool:
        """An admissible arrival at ``t`` interrupts the current decode jump at the next step boundary.

        Returns True if the plan changed (the caller reschedules), False if the jump ends first anyway.
        """
        tm = self.timing
        j = tm.steps_within(self.batch, self.ctx, t - self.now)
        if j >= self.plan_k:
            return False
        dt = tm.decode(self.batch, self.ctx, j)
        self.busy_s += dt
        self.now += dt
        self.steps += j
        self.ctx += self.batch * j
        return True
