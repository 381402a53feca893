"""``boute verify``: serve a plan (or use a running gateway), replay its scenario's traffic, and compare.

Prints the plan's promise beside the measurement (per-tier share, quality, P50/P95, failures) and exits 1
when a check falls outside its tolerance, so a CI job or a deploy script can gate on it. ``--explain`` adds
why the replayed requests went where they went, by tier, from the answers' route reasons
(:mod:`boute.serving.explain`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from boute.cli.options import REPORT, TRACKING_DB, fraction, positive

#: the load generator's per-request timeout unless ``--timeout`` says otherwise, model seconds
DEFAULT_TIMEOUT_S = 120.0

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from boute.quality import QualityModel
    from boute.serving.explain import Explanation
    from boute.serving.replay_requests import Requests
    from boute.serving.verify import Tolerances, Verdict
    from boute.specs import Plan, Scenario


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify_cmd(
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON/YAML (with its .bundle folder)"),
        url: str | None = typer.Option(None, "--url", help="a running gateway serving the plan (default: start one)"),
        duration: float | None = typer.Option(
            None, "--duration", callback=positive, help="seconds of the scenario's arrivals (default: the scenario's)"
        ),
        rate: float | None = typer.Option(None, "--rate", callback=positive, help="req/s (default: the scenario's)"),
        speedup: float = typer.Option(
            1.0, "--speedup", callback=positive, help="emulated backends and arrivals this much faster than real time"
        ),
        seed: int = typer.Option(0, "--seed", min=0, help="arrivals and prompt sample seed"),
        max_tokens: int | None = typer.Option(
            None,
            "--max-tokens",
            min=1,
            help="cap every replayed answer at N tokens (slow real engines); P95 is then reported, not judged",
        ),
        timeout: float = typer.Option(
            DEFAULT_TIMEOUT_S,
            "--timeout",
            callback=positive,
            help="seconds one request may take before it counts as failed (model seconds, like --speedup's)",
        ),
        tol_share: float = typer.Option(0.02, "--tol-share", callback=fraction, help="per-tier share, absolute"),
        tol_quality: float = typer.Option(0.02, "--tol-quality", callback=fraction, help="quality, absolute"),
        tol_p95: float = typer.Option(0.15, "--tol-p95", callback=fraction, help="P95, relative to the promise"),
        stream_share: float = typer.Option(
            0.0,
            "--stream-share",
            callback=fraction,
            help="stream this share of the requests (drawn by --seed) and measure their time to first token",
        ),
        explain: bool = typer.Option(
            False, "--explain", help="also summarise why requests went where they went, by tier (x-boute-reason)"
        ),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        db: str | None = TRACKING_DB,
        report: Path | None = REPORT,
    ) -> None:
        """Replay the plan's scenario workload through its gateway; promised vs measured; exit 1 if outside."""
        from boute.errors import BouteError
        from boute.serving.bundle import open_plan, plan_scenario
        from boute.serving.verify import Tolerances

        p = open_plan(plan)
        sc = plan_scenario(p, plan)
        if sc is None:
            raise BouteError(f"{plan}: scenario_spec: missing; verify replays the plan's own scenario (re-optimise)")
        tol = Tolerances(share=tol_share, quality=tol_quality, p95_rel=tol_p95)
        try:
            verdict, info, why = run_verify(
                plan,
                p,
                sc,
                url=url,
                duration_s=duration,
                rate_rps=rate,
                speedup=speedup,
                seed=seed,
                tol=tol,
                max_tokens=max_tokens,
                timeout_s=timeout,
                stream_share=stream_share,
            )
        except (RuntimeError, TimeoutError) as exc:  # a replica or the gateway did not come up
            raise BouteError(f"verify: {exc}") from None
        if as_json:
            extra = {"explain": why.to_dict()} if explain else {}
            typer.echo(json.dumps({**verdict.to_dict(), **info, **extra}, indent=2))
        else:
            _table(verdict, info)
            if explain:
                _explain_table(why)
        _record(db, plan, p, verdict, info, report, as_json)
        if not verdict.ok:
            raise typer.Exit(1)


def _record(
    db: str | None, path: Path, plan: Plan, verdict: Verdict, info: dict[str, Any], report: Path | None, json_out: bool
) -> None:
    """File the verdict and how the replay ran in the tracking DB against the plan it checked, when the DB
    exists and holds that plan (boute.report.publish says why there), and write the report of the plan's
    experiment (``--report``); ``json_out``: stdout is the JSON verdict, so that is said on stderr."""
    from boute.errors import BouteError
    from boute.report.publish import existing_store, record_verification, write_report

    store = existing_store(db)
    experiment = None
    if store is not None:
        try:
            experiment = record_verification(store, plan.model_dump(mode="json"), verdict.to_dict(), info, str(path))
        finally:
            store.close()
    if report is None:
        return
    if experiment is None:
        where = "there is no tracking DB at" if store is None else "the plan is not one recorded in"
        url = db or "sqlite:///boute.db (the default)"
        raise BouteError(f"--report: {where} {url}: pass the --db the plan was optimised with")
    typer.echo(f"report written: {write_report(db, experiment, report)}", err=json_out)


def run_verify(
    plan_path: Path,
    plan: Plan,
    sc: Scenario,
    *,
    url: str | None,
    duration_s: float | None,
    rate_rps: float | None,
    speedup: float,
    seed: int,
    tol: Tolerances,
    max_tokens: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stream_share: float = 0.0,
) -> tuple[Verdict, dict[str, Any], Explanation]:
    """Serve the plan here unless ``url`` is given, replay, score, compare; and the answers' route reasons.

    ``max_tokens`` and ``timeout_s`` make a replay against a slow real engine mean something: SGLang on two CPU
    cores decodes ~1-5 tokens/s, so unbounded GSM8K answers outlived the fixed 120 s timeout and every request
    counted as failed (docs/sglang.md)."""
    import tempfile

    from boute.cli.stack import ServeStack
    from boute.quality import quality_model_for
    from boute.quality.build import profile_for, tier_models
    from boute.serving.explain import explain_routes
    from boute.serving.replay_requests import build_requests
    from boute.serving.verify import compare, measure

    qm = quality_model_for(sc)  # the plan's own router and its held-out split (the promise's prompts)
    profile = profile_for(sc)
    columns = dict(zip([t.name for t in sc.tiers], tier_models(sc, profile), strict=True))
    req = build_requests(
        sc,
        profile,
        qm.test_index,
        duration_s=duration_s,
        rate_rps=rate_rps,
        seed=seed,
        max_tokens=max_tokens,
        assign=plan_assign(plan, qm, sc.workload.seed),
        stream_share=stream_share,
    )
    rate = rate_rps or sc.workload.rate_rps
    info: dict[str, Any] = {"rate_rps": rate, "duration_s": duration_s or sc.workload.duration_s, "speedup": speedup}
    info.update({"timeout_s": timeout_s, "max_tokens": max_tokens, "capped_requests": req.capped})
    info["stream_share"] = stream_share
    with tempfile.TemporaryDirectory(prefix="boute-verify-") as tmp:
        if url is not None:
            info["gateway"] = url
            results = _generate(Path(tmp), url, req, speedup, timeout_s)
        else:
            from backends.emulated.launch import free_port

            with ServeStack(plan_path, plan, port=free_port(), quiet=True, stop_ends_command=False) as stack:
                stack.start_emulated(speedup)
                stack.start_gateway()
                info["gateway"] = f"boute serve --emulate at {stack.url}"
                results = _generate(Path(tmp), stack.url, req, speedup, timeout_s)
    measured = measure(results, req.rows, profile, columns)
    why = explain_routes(plan.routing.tiers, results["tier"], results.get("reason") or [None] * len(results["tier"]))
    return compare(plan, measured, tol, capped_at=max_tokens if req.capped else None), info, why


def plan_assign(plan: Plan, qm: QualityModel, seed: int) -> Callable[[np.ndarray], np.ndarray] | None:
    """Profile rows -> the tier that answers each under the plan's routing, as the simulator applied it when
    the plan was judged (``QualityModel.assign``, the sim evaluator's rule); None for a plan without fractions."""
    fractions = plan.routing.fractions
    if fractions is None:
        return None
    import numpy as np

    return lambda rows: qm.assign(rows, np.asarray(fractions, dtype=float), mode=plan.routing.mode, seed=seed)


def _generate(work: Path, url: str, req: Requests, speedup: float, timeout_s: float) -> dict[str, Any]:
    """The open-loop load generator, in a process of its own (its CPU is not the gateway's); it is given the
    last arrival plus one request timeout, plus a minute to start and write its results."""
    import subprocess
    import sys

    from boute.errors import BouteError

    spec = {"url": url, "send_at": req.send_at.tolist(), "bodies": req.bodies, "speedup": speedup}
    spec["timeout_s"] = timeout_s
    (work / "requests.json").write_text(json.dumps(spec))
    horizon = (float(req.send_at[-1]) + timeout_s) / speedup + 60.0 if len(req.send_at) else 60.0
    cmd = [sys.executable, "-m", "boute.serving.loadgen", str(work / "requests.json"), str(work / "results.json")]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=horizon, check=False)
    except subprocess.TimeoutExpired:
        raise BouteError(f"verify: the load generator did not finish within {horizon:.0f} s") from None
    if done.returncode != 0:
        last = ((done.stderr or "").strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise BouteError(f"verify: load generator failed: {last}")
    return json.loads((work / "results.json").read_text())


def _table(verdict: Verdict, info: dict[str, Any]) -> None:
    m = verdict.measured
    typer.echo(
        f"{m.requests} requests at {info['rate_rps']:g} req/s over {info['duration_s']:g} s "
        f"({info['gateway']}); load generator {m.generator_cpu_share:.0%} of a core"
    )
    if info.get("max_tokens") is not None:
        typer.echo(
            f"answers capped at {info['max_tokens']} tokens: {info['capped_requests']} of {m.requests} requests "
            f"asked for fewer tokens than the scenario's; per-request timeout {info['timeout_s']:g} s"
        )
    if m.requests > m.failed:  # measured even where the plan promises no latency (and so no check shows it)
        typer.echo(f"latency of the {m.requests - m.failed} answered: P50 {m.p50_s:.3g} s, P95 {m.p95_s:.3g} s")
    typer.echo(f"{'check':<18} {'promised':>10} {'measured':>10}  {'tolerance':<10} ok")
    for c in verdict.checks:
        promised = "-" if c.promised is None else f"{c.promised:.4g}"
        typer.echo(f"{c.name:<18} {promised:>10} {c.measured:>10.4g}  {c.tolerance:<10} {'yes' if c.ok else 'NO'}")
    if m.answers_match_profile is not None:
        typer.echo(f"answers that are the answering tier's recorded response: {m.answers_match_profile:.1%}")
    for n in verdict.notes:
        typer.echo(f"note: {n}")
    typer.echo("verified: the plan serves as promised" if verdict.ok else "NOT verified: see the checks marked NO")


def _explain_table(why: Explanation) -> None:
    """Why the answered requests went where they went (``--explain``): per tier, then per cascade hop."""
    typer.echo(f"why requests went where they went (x-boute-reason of {why.explained} answers):")
    if why.unexplained:
        typer.echo(f"  {why.unexplained} answers carried no readable reason (a gateway older than the header?)")
    typer.echo(f"  {'tier':<12} {'requests':>8}  {'chosen by':<28} {'router score':<17} compared with")
    for t in why.tiers:
        how = ", ".join(f"{k} {n}" for k, n in t.how.items())
        scores = "-" if t.score_min is None else f"{t.score_min:.4f}-{t.score_max:.4f}"
        cut = [f"> {', '.join(f'{v:.4f}' for v in t.above)}"] if t.above else []
        cut += [f"<= {', '.join(f'{v:.4f}' for v in t.upto)}"] if t.upto else []
        if t.prices is not None:
            cut.append("prices " + ", ".join(f"{p:.4f}" for p in t.prices))
        typer.echo(f"  {t.tier:<12} {t.requests:>8}  {how:<28} {scores:<17} {' and '.join(cut) or '-'}")
    if why.hops:
        typer.echo(f"  {'cascade hop':<12} {'answers':>8}  {'verdicts':<44} judge score p10/p50/p90 vs threshold")
        for h in why.hops:
            verdicts = ", ".join(f"{k} {n}" for k, n in h.verdicts.items())
            q = [h.judge_p10, h.judge_p50, h.judge_p90]
            judged = "-" if q[1] is None else "/".join(f"{v:.3f}" for v in q if v is not None)
            thr = "" if h.threshold is None else f" vs {h.threshold:.4f}"
            typer.echo(f"  {h.tier:<12} {h.reached:>8}  {verdicts:<44} {judged}{thr}")
    if why.inconsistent:
        typer.echo(f"  {why.inconsistent} reasons contradict their own cut or the tier that answered: routed off plan")
