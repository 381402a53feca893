"""The gateway's core: wires shared state, balancer, policy and proxy, and serves one completion request.

Kept apart from the FastAPI routes (app.py) so the request path is plain asyncio code that is easy to
read and to time: ``x-boute-overhead-ms`` is the handler's wall time minus the time spent waiting on
upstream replicas and judges. The gateway owns its accounting: the requests in flight (in all, and per tier),
held by a streamed answer until its body is closed (:class:`router.held_stream.HeldStream`). Sending a
request on, to its tier or down the cascade, is :mod:`router.dispatch`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from boute.serving import BACKENDS, BackendSpec, RedisKeys
from boute.serving.bundle import artifact_cache, bundle_files, materialise, open_plan, plan_catalog
from boute.serving.reason import HEADER
from boute.specs.plan import Plan, check_plan_hardware
from router import access
from router.balancer import Balancer
from router.config import Settings
from router.dispatch import send_cascade, send_single
from router.errors import (
    BodyTooLarge,
    ClientGone,
    GatewayError,
    NoPlan,
    Overloaded,
    UpstreamFailure,
    retry_after,
)
from router.held_stream import HeldStream
from router.http.reply import Reply, unless_disconnected
from router.http.request_body import read_body
from router.metrics import Metrics
from router.observe import Observer, answer_tokens, healthy_groups
from router.openai_io import (
    affinity_text,
    check_context,
    completion_as_sse,
    parse_request,
    wants_usage,
)
from router.proxy import Proxy, Result, Stream, make_client
from router.routing import Judge, RoutePolicy, endpoint_judge
from router.state import SharedState
from router.upstream import Pool

if TYPE_CHECKING:  # boute.sim loads on the first plan, not with the gateway's imports
    from boute.sim.affinity import PromptKeys

log = logging.getLogger("boute.router")

SSE_HEADERS = {"cache-control": "no-cache"}


class Gateway:
    def __init__(self, settings: Settings, plan: Plan | None = None, backends: list[BackendSpec] | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics(self)
        self.observer = Observer(settings.observe_interval_s)
        self.balancer = Balancer(settings, on_trip=self._tripped, on_route=self.metrics.routed)
        self.state = SharedState(settings, self._on_change, self.balancer.mark_down, prepare=self.policy_for)
        self.policy: RoutePolicy | None = None
        self.plan_error: str | None = None
        self._compiled: RoutePolicy | None = None
        self.inflight = 0
        self.tier_inflight: dict[str, int] = {}
        # N workers on one port share the admission bounds: each admits below bound / N (compared as
        # held * N >= bound: integers, no division per request), so the serve sheds where one gateway would
        self.workers = settings.workers
        self.scoring = 0
        self.draining = False
        self._initial_plan = plan
        self._initial_backends = backends
        self._tasks: list[asyncio.Task[Any]] = []
        self.client: Pool | None = None  # upstream connection pool: made in start(), in the loop
        self.proxy: Proxy | None = None
        self._retry = retry_after(settings.retry_after_s)  # sent with 429 and 503
        self.access_log = settings.access_log
        if self.access_log:
            access.enable()

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        plan = self._initial_plan or (open_plan(s.plan) if s.plan else None)
        backends = self._initial_backends
        if backends is None:
            backends = BACKENDS.validate_json(Path(s.backends).read_bytes()) if s.backends else []
        client = self.client = make_client(s)
        self.proxy = Proxy(client, self.balancer, s)
        await self.state.start(plan, backends)
        await self.check_replicas()  # start-up: replicas that do not answer start as down
        self._tasks.append(asyncio.create_task(self.balancer.health_loop(client), name="boute-health"))
        keys = RedisKeys(s.redis_prefix)
        watch = self.observer.run(lambda: healthy_groups(self.balancer), s.redis_url, keys.observations)
        self._tasks.append(asyncio.create_task(watch, name="boute-observe"))
        # Start-up objects (modules, catalog, pydantic schemas: ~10^5) never die; without freezing, every
        # full collection walks them all and stalls the event loop for tens of ms (seen as p99 latency).
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.state.stop()
        if self.client is not None:
            await self.client.close()

    async def check_replicas(self) -> None:
        """Health-check every replica now (at start-up, and when the registry is replaced)."""
        assert self.client is not None  # made in start(), before any request
        await self.balancer.check_all(self.client)

    def _scored(self, job: asyncio.Future[float]) -> None:
        self.scoring -= 1
        if not job.cancelled():
            job.exception()  # retrieved here: a waiter that left would otherwise leave it "never retrieved"

    def _on_change(self, plan: Plan | None, backends: list[BackendSpec]) -> bool:
        """Adopt ``plan`` (compiled by :meth:`policy_for`, memoised) and ``backends``; False when the plan
        is refused, the previous one then stays live and ``plan_error`` says why."""
        accepted = True
        if plan is not None and (self.policy is None or self.policy.plan != plan):
            try:
                self.policy = self.policy_for(plan)
            except Exception as exc:  # e.g. router files that cannot be had or do not verify: keep serving
                log.error("plan not applied, keeping the previous one: %s", exc)
                self.plan_error, accepted = str(exc), False
            else:
                self.plan_error = None
                self.metrics.plan(plan)
                log.info("plan applied: %s mode, tiers %s", plan.routing.mode, list(plan.routing.tiers))
        if self.policy is not None:
            self.balancer.configure(self.policy.plan, backends, self.policy.root)
        else:
            self.balancer.configure(plan, backends)
        if self.balancer.affinity is not None:
            self.metrics.affinity_started(self.balancer.indexes)
        return accepted

    def policy_for(self, plan: Plan) -> RoutePolicy:
        """The compiled routing of ``plan``, its bundle files found beside the plan file, under
        ``bundle_root`` or in the shared store (Redis); SpecError when they cannot be had or do not verify.
        Memoised: the admin API compiles a plan to validate it, then the change notification adopts it."""
        if self._compiled is not None and self._compiled.plan == plan:
            return self._compiled
        s = self.settings
        root = Path(s.bundle_root) if s.bundle_root else Path(s.plan).parent if s.plan else None
        where = materialise(plan, self.state.fetch_artifact, root, artifact_cache())
        check_plan_hardware(plan, plan_catalog(plan, "plan"), "plan")
        self._compiled = RoutePolicy(plan, where, judge=self._judge(plan), file=s.plan or "plan")
        return self._compiled

    def plan_files(self, plan: Plan) -> list[tuple[str, bytes]]:
        """Compile ``plan`` (SpecError when it cannot serve) and return its bundle files, read where the
        compiled routing found them, for the shared store."""
        root = self.policy_for(plan).root
        return bundle_files(plan, root) if plan.artifacts else []

    def _judge(self, plan: Plan) -> Judge | None:
        """The LLM judge at BOUTE_JUDGE_URL for a cascade whose plan names an 'llm' judge; None otherwise
        (RoutePolicy loads a verifier from the plan's bundle, and refuses a cascade that names no judge)."""
        s, r = self.settings, plan.routing
        if s.judge_url and r.mode == "cascade" and r.judge != "llm":
            log.warning(
                "BOUTE_JUDGE_URL is not used: the plan's judge is its '%s', whose scores it was cut on", r.judge
            )
        return endpoint_judge(r, s.judge_url, s.judge_model, s.judge_timeout_s, s.plan or "plan")

    def _tripped(self, backend_id: str) -> None:
        log.warning("replica %s tripped for %.1fs", backend_id, self.settings.cooldown_s)
        self.state.report_down(backend_id)

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.policy is None:
            return False, "no plan loaded"
        counts = self.balancer.healthy_tiers()
        # a tier the plan sends no load to (fraction 0) needs no replica to be ready
        fr = self.policy.plan.routing.fractions
        cascade = self.policy.mode == "cascade"
        loaded = [t for i, t in enumerate(self.policy.tiers) if fr is None or fr[i] > 0 or (cascade and i == 0)]
        missing = [t for t in loaded if counts.get(t, 0) == 0]
        if missing:
            return False, f"no healthy replica for tier(s) {missing}"
        return True, "ready"

    # ---- what the gauges read (router.metrics.Gauged) ------------------------------------------
    def judge_failures(self) -> int:
        """Answers the current plan's cascade judge could not score (an LLM judge counts them)."""
        judge = self.policy.judge if self.policy is not None else None
        return int(getattr(judge, "failures", 0))

    def healthy_tiers(self) -> dict[str, int]:
        return self.balancer.healthy_tiers()

    # ---- the request path ---------------------------------------------------------------------
    async def handle(self, request: Request, kind: str) -> Response:
        """The FastAPI route's entry (same path as :meth:`handle_asgi`)."""
        return await self.handle_asgi(request.scope, request.receive, kind)

    async def handle_asgi(self, scope: Scope, receive: Receive, kind: str) -> Response:
        """Serve one completion request from ASGI (the body read here; client disconnects watched through
        ``receive``). The HTTP fast path (router/http/protocol.py) calls :meth:`serve` directly instead."""
        return (await self.serve(kind, None, scope=scope, receive=receive)).response()

    async def serve(
        self,
        kind: str,
        raw: bytes | None,
        *,
        oversize: bool = False,
        scope: Scope | None = None,
        receive: Receive | None = None,
    ) -> Reply:
        """One completion request, step by step: admit it (a plan, a free slot), read and check its body,
        pick its tier (forced by ``model``, scored, or the cascade's first), take a slot of that tier, send it.
        ``raw`` is its body (``None``: read it through ASGI ``receive``; ``oversize``: it was over
        ``max_body_bytes`` and not kept). Without ``receive`` the caller cancels this coroutine when the
        client disconnects."""
        t0 = time.perf_counter()
        s = self.settings
        policy = self.policy
        if policy is None:
            return Reply.failed(NoPlan(self._retry))
        if self.inflight * self.workers >= (s.max_inflight or policy.inflight_total):
            return self._refused(Overloaded("inflight", "too many requests in flight", self._retry))
        self.inflight += 1
        release = True
        try:
            if oversize:
                raise BodyTooLarge(s.max_body_bytes)
            if raw is None:
                assert scope is not None and receive is not None  # the ASGI path hands both
                raw = await read_body(scope, receive, s.max_body_bytes)
            body, prompt, stream, chars = parse_request(raw, kind)
            forced = policy.resolve_model(body.get("model"))
            score: float | None = None
            if forced is not None:
                tier, cascade = forced, False
            elif policy.mode == "preroute":
                if policy.scoring == "inline":
                    score = policy.score_sync(prompt)
                elif policy.scoring == "batch":
                    score = await policy.score_batched(prompt)
                else:
                    score = await self._score_in_thread(policy, prompt)
                tier, cascade = policy.tier_for_score(score), False
            else:
                tier, cascade = 0, True
            entry = policy.tiers[tier]
            context = policy.context.get(entry)
            if context is not None:  # before it takes a slot: it could never be answered as asked
                check_context(body, kind, chars, context)
            self.observer.arrival(prompt, score if policy.difficulty else None)
            held = self.tier_inflight.get(entry, 0)
            per_replica = s.tier_queue_per_replica or policy.inflight_per_replica[entry]
            if held * self.workers >= per_replica * max(1, self.balancer.healthy(entry)):
                self.observer.done(entry, False, 0.0, None)
                return self._refused(Overloaded("tier_queue", f"tier '{entry}' is at capacity", self._retry))
            self.tier_inflight[entry] = held + 1
            keys = self._prompt_keys(body, kind)
            reply = await self._dispatch(policy, tier, cascade, score, kind, body, prompt, stream, receive, t0, keys)
            if self.access_log:
                access.answered(kind, reply, time.perf_counter() - t0)
            if reply.stream is not None:  # closing the stream releases both holds
                release = False
            else:
                self.tier_inflight[entry] -= 1
            return reply
        except ClientGone:
            return Reply(499)
        except GatewayError as exc:
            return self._refused(exc)
        finally:
            if release:
                self.inflight -= 1

    def _prompt_keys(self, body: dict[str, Any], kind: str) -> PromptKeys | None:
        """The prompt's prefix keys where affinity is in force (:mod:`boute.sim.affinity`), else None."""
        settings = self.balancer.affinity
        if settings is None:
            return None
        from boute.sim.affinity import prompt_keys

        return prompt_keys(affinity_text(body, kind, settings.block_chars * settings.max_blocks), settings)

    async def _score_in_thread(self, policy: RoutePolicy, prompt: str) -> float:
        """Score on a worker thread (a slow scorer); a full queue is shed at once, not waited on."""
        if self.scoring >= self.settings.max_scoring_queue:
            raise Overloaded("scoring", "routing is saturated", self._retry)
        # counted until the scoring thread is done, not until this request stops waiting: a client that gives up
        # does not free the thread, so it must not free the bound either
        self.scoring += 1
        job = asyncio.get_running_loop().run_in_executor(None, policy.score_sync, prompt)
        job.add_done_callback(self._scored)
        return await asyncio.shield(job)

    def _refused(self, exc: GatewayError) -> Reply:
        """The answer to a request refused with ``exc``, counted: a shed by its bound (``boute_rejected``);
        anything else in ``boute_requests`` under the tier that took the request ("-" when none did), and a
        failure of the tier it was sent to also as that tier's failed request (the re-plan loop's record)."""
        if self.access_log:
            access.refused(exc)
        if isinstance(exc, Overloaded):
            self.metrics.reject(exc.reason)
        elif isinstance(exc, UpstreamFailure):
            self.observer.done(exc.tier, False, 0.0, None)
            self.metrics.count(exc.tier if exc.taken else "-", exc.status)
        else:
            self.metrics.count("-", exc.status)
        return Reply.failed(exc)

    async def _dispatch(
        self,
        policy: RoutePolicy,
        tier: int,
        cascade: bool,
        score: float | None,
        kind: str,
        body: dict[str, Any],
        prompt: str,
        stream: bool,
        receive: Receive | None,
        t0: float,
        keys: PromptKeys | None = None,
    ) -> Reply:
        """Send to the tier (or down the cascade) and answer. A streamed answer (``Reply.stream``) holds the
        request's in-flight counts until it is closed; otherwise the caller releases them now. ``score``: what
        the tier was chosen by (None: the request's model forced it, or a cascade, whose hops say why);
        ``keys``: the prompt's prefix keys, for the replica's choice (None: least load)."""
        entry = policy.tiers[tier]
        try:
            proxy = self.proxy
            assert proxy is not None  # made in start(), before any request
            work = (
                send_cascade(proxy, policy, kind, body, prompt, stream, keys, self.metrics.escalations.inc)
                if cascade
                else send_single(proxy, policy, tier, kind, body, stream, keys)
            )
            done = await (unless_disconnected(receive, work) if receive is not None else work)
        except BaseException:
            self.tier_inflight[entry] -= 1
            raise
        if done is None:
            return Reply(499)
        result = done.answer
        tier_name = policy.tiers[done.tier]
        overhead = time.perf_counter() - t0 - done.waited_s
        if cascade or score is None:  # a cascade's hops say why; no score: the request's model forced the tier
            reason = done.reason or policy.reasons.forced(tier)
        else:
            reason = policy.reasons.preroute(tier, score)
        headers = {
            "x-boute-tier": tier_name,
            "x-boute-replica": result.replica.id,
            "x-boute-overhead-ms": f"{overhead * 1e3:.3f}",
            HEADER: reason,
        }
        if done.hops > 1:
            headers["x-boute-hops"] = str(done.hops)
        status = result.status if isinstance(result, Result) else 200
        self.metrics.observe(tier_name, status, overhead)
        if isinstance(result, Stream):  # its first chunk is in hand: the client's first token goes out now
            self._first_token(headers, tier_name, time.perf_counter() - t0)
            headers.update(SSE_HEADERS)
            return Reply(200, b"", headers, "text/event-stream", HeldStream(self, result, entry, tier_name, t0))
        latency = time.perf_counter() - t0
        self.observer.done(tier_name, status == 200, latency, answer_tokens(result.body) if status == 200 else None)
        if status == 200:
            self.metrics.served(tier_name, latency)
            self.metrics.usage(tier_name, result.replica.id, result.body)
        if stream and status == 200:  # cascade accepted a non-final tier: re-send as SSE, whole, after the judge
            self._first_token(headers, tier_name, latency)
            headers.update(SSE_HEADERS)
            return Reply(200, completion_as_sse(result.body, kind, wants_usage(body)), headers, "text/event-stream")
        return Reply(status, result.body, headers)

    def _first_token(self, headers: dict[str, str], tier: str, seconds: float) -> None:
        """A streamed answer's time to first token, as its client gets it (after every judged cascade hop):
        the ``x-boute-ttft-ms`` header and ``boute_ttft_seconds{tier}``."""
        headers["x-boute-ttft-ms"] = f"{seconds * 1e3:.3f}"
        self.metrics.first_token(tier, seconds)

    def release_stream(self, entry: str) -> None:
        """A streamed request's holds end (called once by :class:`HeldStream` when it closes)."""
        self.inflight -= 1
        self.tier_inflight[entry] -= 1
