"""The ``live`` evaluator: deploy the candidate, send real traffic through a real gateway, measure.

Each candidate plan is rolled out on the local target with emulated backends (SGLang on GPU hosts is the
same controller with ``emulate=False``), a gateway follows the deployment's Redis registry, a short sample
of the scenario's workload is replayed over HTTP, and P95 latency and quality are taken from the answers:
the emulated replicas answer profile prompts with the recorded responses of the tier's model, and each
answer is scored with the profile's correctness for the tier that answered (``x-boute-tier``). Candidates
follow each other as rolling updates, so replicas two plans share are reused; ``close()`` tears it all down.
The fleet is private: replicas and gateway listen on loopback, and the replicas require a fresh bearer token
that only this evaluator's gateway holds (:mod:`boute.serving.auth`).
"""

from __future__ import annotations

import math
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from backends.deploy.controller import Controller
from backends.deploy.gateway import start_gateway
from backends.deploy.launch import LOOPBACK, LaunchOptions
from backends.deploy.local import LocalTarget
from backends.deploy.registry import Registry
from boute.errors import BouteError
from boute.optimize.evaluators import (
    OVERLOAD_P95_S,
    EvalDetail,
    EvalResult,
    candidate_plan,
    llm_judge_of,
    router_files_of,
    router_of,
    scorer_of,
    verifier_of,
)
from boute.optimize.space import Candidate
from boute.serving.auth import TOKEN_ENV
from boute.serving.bundle import open_plan, write_plan
from boute.serving.registry import DEFAULT_REDIS_URL
from boute.specs import Scenario
from boute.stats import quantile

#: failed requests above this share mean the plan cannot carry the load
MAX_FAILED_SHARE = 0.01


class LiveEvaluator:
    """Registered as evaluator ``live`` by the CLI (the core never imports the deployment side)."""

    name = "live"
    fidelity = 2
    quality_model = None  # quality is measured on a sample of answers, not modelled

    def __init__(
        self,
        scenario: Scenario,
        mode: str = "preroute",
        *,
        redis_url: str = DEFAULT_REDIS_URL,
        speedup: float = 10.0,
        duration_s: float | None = None,
        max_requests: int = 200,
        seed: int = 0,
        workdir: Path | None = None,
        quality_model: Any = None,
        workload: Any = None,
    ) -> None:
        """``quality_model`` and ``workload`` (a search's, handed to every evaluator it makes) are not used:
        a live evaluation routes by the scenario's learned router and replays its own sample of the
        scenario's stream, ``duration_s`` long and at most ``max_requests`` requests."""
        from boute.quality import quality_model_for
        from boute.quality.profiles import load_profile
        from boute.workload import Workload, replay_workload

        self.scenario, self.mode, self.speedup, self.redis_url = scenario, mode, speedup, redis_url
        # candidates are routed by the scenario's learned router (a cascade: judged by its verifier, with the
        # thresholds the quality model cuts on that verifier's scores), shipped to the gateway in a plan bundle
        self._quality = quality_model_for(scenario)
        w = replay_workload(scenario, self._quality.test_index, duration_s=duration_s, seed=seed)
        k = min(max_requests, len(w.arrival_s))
        self.workload = Workload(
            w.arrival_s[:k],
            w.input_tokens[:k],
            w.output_tokens[:k],
            w.prompt_index[:k],
            w.rate_rps,
            float(w.arrival_s[k - 1]) if k else 0.0,
            None if w.tier_output_tokens is None else w.tier_output_tokens[:k],
        )
        self.profile = load_profile(scenario.quality.profile, scenario.quality.format)
        self._router = router_of(self._quality) if mode == "preroute" else None
        self._router_files = router_files_of(self._quality) if self._router else []
        self.columns = {t.name: self.profile.models.index(t.quality_model or t.name) for t in scenario.tiers}
        missing = [
            m for m in (self.profile.models[c] for c in self.columns.values()) if m not in self.profile.responses
        ]
        if missing:  # the live evaluator scores answers by matching them against the recorded ones
            where = scenario.source or scenario.name
            raise BouteError(
                f"{where}: quality.profile: no recorded responses for {', '.join(missing)}; "
                "the live evaluator needs a profile with answers (e.g. RouteLLM's CSV), not scores only"
            )
        from boute.optimize.replay import replay_conversations

        # what ``boute verify`` sends: a multi-turn query carries its earlier exchange
        self.messages = replay_conversations(self.profile, self.workload.prompt_index)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="boute-live-"))
        self._ctl: Any = None
        self._gateway: Any = None
        self.gateway_url: str | None = None
        self._token = uuid.uuid4().hex  # the gateway's admin token
        self._replica_token = uuid.uuid4().hex  # what the replicas ask of the gateway

    # ---- the fleet -----------------------------------------------------------------------------
    def _fleet(self) -> None:
        opts = LaunchOptions(
            emulate=True,
            speedup=self.speedup,
            profile=self.scenario.quality.profile,
            profile_models={t.name: t.quality_model or t.name for t in self.scenario.tiers},
            host=LOOPBACK,
            token=self._replica_token,
        )
        reg = Registry(self.redis_url, f"boute-live-{uuid.uuid4().hex[:8]}")
        self._ctl = Controller(
            LocalTarget(self.workdir / "logs", opts),
            reg,
            opts,
            None,
            ready_timeout_s=120,
            propagation_s=0.2,
            stop_grace_s=5.0,
        )

    def _ensure_gateway(self) -> None:
        if self._gateway is None:
            reg = self._ctl.registry
            self.gateway_url, self._gateway = start_gateway(
                reg.url,
                reg.prefix,
                self.workdir / "logs",
                env={"BOUTE_ADMIN_TOKEN": self._token, TOKEN_ENV: self._replica_token},
            )

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the gateway runs this rollout's plan version and sees exactly its replicas, all healthy.

        (Not ``/ready``: it asks for a replica in every routing tier, and a candidate may give a tier no
        load and no replicas.)"""
        import httpx

        want = {e.key.id for e in self._ctl.replicas.values()}
        auth = {"Authorization": f"Bearer {self._token}"}
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                plan = httpx.get(f"{self.gateway_url}/admin/plan", headers=auth, timeout=1.0).json()
                backs = httpx.get(f"{self.gateway_url}/admin/backends", headers=auth, timeout=1.0).json()["backends"]
                seen = {b["id"] for b in backs if b.get("healthy", True)}
                if int(plan.get("version", 0)) >= self._ctl.plan_version and seen == want:
                    return
                last = f"plan version {plan.get('version')}, healthy backends {sorted(seen)}"
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                last = type(exc).__name__
            time.sleep(0.1)
        raise BouteError(
            f"live evaluator: gateway {self.gateway_url} not serving the candidate after {timeout_s:g}s ({last})"
        )

    # ---- one evaluation ------------------------------------------------------------------------
    def _write_plan(self, cand: Candidate) -> Path:
        """The candidate's plan with its bundle: the router for a pre-route, the verifier for a cascade."""
        out = self.workdir / "candidate.json"
        if self.mode != "cascade":
            prices = self._quality.preroute(cand.fractions).prices  # a multi router's cut (None: the ladder's)
            plan = candidate_plan(
                self.scenario,
                cand,
                self.mode,
                router=self._router,
                scorer=scorer_of(self._quality),
                prices=None if prices is None else [float(v) for v in prices],
            )
            return write_plan(plan, out, self.scenario, self._router_files)
        from boute.quality.judges import verifier_files

        theta = self._quality.cascade_thresholds(cand.fractions)  # trains (or loads) the verifier first
        verifier = verifier_of(self._quality)
        judge_model = llm_judge_of(self._quality)  # an LLM judge: the gateway's BOUTE_JUDGE_URL serves it
        plan = candidate_plan(self.scenario, cand, "cascade", theta, verifier=verifier, judge_model=judge_model)
        return write_plan(plan, out, self.scenario, verifier_files=verifier_files(verifier) if verifier else ())

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.optimize.replay import replay
        from boute.sim import plan_cost

        t0 = time.perf_counter()
        if self._ctl is None:
            self._fleet()
        path = self._write_plan(cand)
        self._ctl.plan_root = self.workdir
        self._ctl.apply(open_plan(path))
        self._ensure_gateway()
        self._wait_ready()
        deploy_s = time.perf_counter() - t0
        res = replay(self.gateway_url, self.workload, self.messages, self.speedup)
        m = score(res, self.workload.prompt_index, self.profile, self.columns)
        cost = float(plan_cost(list(cand.deployment), self.scenario))
        failed = 1.0 - m["ok_share"]
        p95 = m["p95"] if failed <= MAX_FAILED_SHARE and math.isfinite(m["p95"]) else OVERLOAD_P95_S
        return EvalResult(
            quality=m["quality"],
            p95_latency_s=float(min(p95, OVERLOAD_P95_S)),
            throughput_rps=m["ok"] / max(1e-9, res.wall_s * self.speedup),
            cost_per_hour=cost,
            feasible=failed <= MAX_FAILED_SHARE
            and self.scenario.goal.met_by(m["quality"], p95, cost, quality_se=m["quality_stderr"]),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=m["p50"],
            mean_latency_s=m["mean"],
            extra=EvalDetail(
                requests=len(self.messages),
                failed=int(round(failed * len(self.messages))),
                answered_shares=m["tier_shares"],
                quality_stderr=m["quality_stderr"],
                answers_match_profile=m["match"],
                speedup=self.speedup,
                deploy_s=deploy_s,
                replay_wall_s=res.wall_s,
            ),
        )

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.stop(5.0)
            self._gateway = None
        if self._ctl is not None:
            self._ctl.down()
            self._ctl.registry.clear()
            self._ctl.registry.close()
            self._ctl = None

    def __enter__(self) -> LiveEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def score(res: Any, prompt_index: np.ndarray, profile: Any, columns: dict[str, int]) -> dict[str, Any]:
    """Latency percentiles (model seconds) and quality of the answers that came back.

    An answer to a profile prompt scores the profile's correctness of the tier that answered; an answer
    that is not that tier's recorded response (or has no tier) scores 0, and ``match`` reports the share
    that did match, so a gateway or backend mix-up shows up instead of being papered over.
    """
    ok = res.ok
    lat = res.latency_s[ok]
    scores, matched, counted = [], 0, 0
    shares: dict[str, int] = {}
    for i in np.flatnonzero(ok):
        tier = res.tier[i]
        shares[str(tier)] = shares.get(str(tier), 0) + 1
        row = int(prompt_index[i])
        if row < 0:
            continue
        counted += 1
        col = columns.get(tier or "")
        recorded = profile.responses[profile.models[col]][row] if col is not None else None
        if recorded is not None and res.text[i] == recorded:
            matched += 1
            scores.append(float(profile.scores[row, col]))
        else:
            scores.append(0.0)
    n_ok = int(ok.sum())
    return {
        "ok": n_ok,
        "ok_share": n_ok / max(1, len(ok)),
        "p95": quantile(lat, 0.95) if n_ok else math.inf,
        "p50": quantile(lat, 0.50) if n_ok else None,
        "mean": float(lat.mean()) if n_ok else None,
        "quality": float(np.mean(scores)) if scores else 0.0,
        "quality_stderr": float(np.std(scores, ddof=1) / math.sqrt(len(scores))) if len(scores) > 1 else 0.0,
        "match": matched / max(1, counted),
        "tier_shares": {t: c / max(1, n_ok) for t, c in shares.items()},
    }
