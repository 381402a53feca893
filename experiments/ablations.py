"""Experiment 3, ablations of BOute's optimiser on gsm8k-f87 (equal evaluation budgets, same seeds).

Variants, each changing one thing of the search ``boute optimize`` runs by default
(:meth:`experiments.common.Evaluators.search`, without its screen: every proposal is evaluated) and of its :class:`boute.optimize.strategies.mobo.MoboStrategy`
(its public options, or a subclass here where it has no switch):

* ``boute``: the default: the simulator is the objective; exact quality (the quality model as a deterministic
  model), one GP on the simulator's ``-log P95`` less the fast path's (the prior), hybrid constrained LogEI /
  qLogNEHVI over a pool of canonical plans; batches of 4 on one worker process per core.
* ``additive-kernel``: the structured kernel ``k_route + k_place + k_all`` (``kernel="additive"``) instead
  of one Matern kernel over all dims.
* ``no-exact-quality``: quality modelled by a second GP instead of computed exactly (the structure "quality
  depends on routing only" removed).
* ``no-prior``: the simulator as the objective without the fast path as the GP's prior.
* ``fast-objective``: the fast path as the objective (the search BOute ran before the simulator became its
  objective): the plan it chooses is the fast path's optimum.
* ``scalarised``: single-objective BO: one GP on ``-log P95 - 10 * max(0, logit(floor) - logit(q))`` of
  the simulator, LogEI over the same plan pool (the floor becomes a penalty instead of an exact
  constraint; no prior, since the penalised scalar is not a P95 the fast path predicts).
* ``random``: uniform random points of the same box, simulated.

Every trial's plan is scored by the simulator (re-simulated for ``fast-objective``), so "evaluations to
reach within 10% of the best known P95" is measured on the scale a plan is judged by.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from boute.optimize.strategies.mobo import MoboStrategy
from boute.optimize.surrogates.outcomes import logit
from boute.optimize.trials import figures
from experiments.common import (
    Context,
    Evaluators,
    load,
    new_figure,
    record,
    save_figure,
    save_json,
    save_markdown,
    table,
)
from experiments.metrics import confirm

NAME = "ablations"
SCENARIO = "gsm8k-f87"
VARIANTS = ("boute", "additive-kernel", "no-exact-quality", "no-prior", "fast-objective", "scalarised", "random")
GAP = 0.10  # 'reached the best': within 10% of the best feasible P95 any run found
PENALTY = 10.0


class GPQualityMobo(MoboStrategy):
    """MOBO without the exact quality function: quality is learned by a GP like latency."""

    def bind(self, evaluator: Any) -> None:
        self.quality_fn = None


class ScalarisedBO(MoboStrategy):
    """Single-objective BO on a penalised scalar (same GP fit, initial design and plan pool as BOute)."""

    def ask(self, trials: Sequence[Any]) -> np.ndarray:
        x0 = self._design.ask(trials)  # BOute's initial design, ended by BOute's rule
        if x0 is not None:
            return x0
        n = len(trials)
        ok = [t for t in trials if t.ok]
        import torch
        from botorch.acquisition.analytic import LogExpectedImprovement

        from boute.optimize.acquisition.pool import build_pool

        torch.set_num_threads(self.threads)
        torch.manual_seed(self.seed * 100003 + n)
        rng = np.random.default_rng([self.seed, n, 11])
        tg = self.space.scenario.targets
        _, q, p, _ = figures(ok)
        lf = float(logit(np.array([max(tg.quality_floor, 1e-4)]))[0])
        s = -np.log(np.clip(p, 1e-6, self.clip_factor * tg.p95_latency_s)) - PENALTY * np.maximum(0.0, lf - logit(q))
        X = torch.tensor(np.array([t.z for t in ok]), dtype=torch.double)
        gp = self.latency_gp.fit(X, torch.tensor(s, dtype=torch.double).unsqueeze(-1))
        centres = [np.asarray(ok[int(i)].z, dtype=float) for i in np.argsort(-s)[:3]]
        pool = build_pool(
            self.space,
            centres,
            (t.candidate.key() for t in trials),
            rng,
            n_global=self.pool_global,
            n_local=self.pool_local,
        )
        if len(pool.z) == 0:
            return rng.random(self.space.dim)
        acq = LogExpectedImprovement(gp, best_f=float(s.max()), maximize=True)
        with torch.no_grad():
            scores = acq(torch.tensor(pool.z, dtype=torch.double).unsqueeze(1)).numpy()
        return pool.z[int(np.argmax(scores))]


def settings(ctx: Context) -> dict[str, Any]:
    return {
        "seeds": ctx.pick(5, 1, 1),
        "max_evals": ctx.pick(40, 20, 7),
        "random_evals": ctx.pick(400, 60, 10),
        "mobo_options": ctx.pick({}, {"n_init": 10}, {"n_init": 5, "pool_global": 64, "pool_local": 64}),
    }


def strategy(variant: str, space: Any, seed: int, opts: dict[str, Any], evs: Evaluators) -> Any:
    from boute.optimize.strategies.random import RandomStrategy

    if variant == "random":
        return RandomStrategy(space, seed=seed)
    if variant not in ("no-prior", "fast-objective", "scalarised"):  # the default's prior: the fast path's P95
        opts = {**opts, "prior": lambda cand: evs.fast(cand).p95_latency_s}
    if variant == "additive-kernel":
        return MoboStrategy(space, seed=seed, kernel="additive", **opts)
    cls = {"no-exact-quality": GPQualityMobo, "scalarised": ScalarisedBO}.get(variant, MoboStrategy)
    return cls(space, seed=seed, **opts)


def sim_trace(trials: Sequence[Any], evs: Evaluators) -> list[float]:
    """Best simulated P95 among plans meeting all targets after each evaluation (inf while none does)."""
    best, out = math.inf, []
    for t in trials:
        if t.ok:
            r = evs.sim_of(t.candidate, t.result)
            if r.feasible:
                best = min(best, r.p95_latency_s)
        out.append(best)
    return out


def run_variant(variant: str, seed: int, evs: Evaluators, ctx: Context, st: dict[str, Any]) -> dict[str, Any]:
    from boute.optimize.evaluators.pool import EvaluatorPool
    from boute.optimize.loop import LoopHooks, run_search, targets_of
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Space
    from boute.optimize.trials import choose

    sp = Space.build(evs.scenario)
    search = evs.search()
    ev = evs.fast if variant == "fast-objective" else search.evaluator
    # boute optimize's batches and workers (the settings' defaults), no early stop: every variant runs n
    settings = SearchSettings(max_evals=st["random_evals"] if variant == "random" else st["max_evals"], patience=None)
    t0 = time.perf_counter()
    with EvaluatorPool(ev, evs.scenario, evs.seed, workers=settings.workers) as pool:
        strat = strategy(variant, sp, seed, st["mobo_options"], evs)
        trials = run_search(sp, ev, strat, settings, hooks=LoopHooks(pool=pool))
    wall = time.perf_counter() - t0
    chosen, _ = choose(trials, targets_of(sp))
    row: dict[str, Any] = {
        "variant": variant,
        "seed": seed,
        "evals": len(trials),
        "wall_s": wall,
        "eval_wall_s": sum(t.result.wall_s for t in trials if t.ok),
        "trace": sim_trace(trials, evs),
    }
    if chosen is not None:
        sim = confirm(evs, chosen.candidate, seed=ctx.seed)
        row.update(
            {
                "chosen_p95_s": chosen.result.p95_latency_s,
                "sim_p95_s": sim["p95_latency_s"],
                "sim_meets": sim["meets"],
                "quality": chosen.result.quality,
            }
        )
    return row


def evals_to(trace: list[float], target: float) -> int | None:
    for i, v in enumerate(trace):
        if v <= target * (1 + GAP):
            return i + 1
    return None


def summarise(runs: list[dict[str, Any]]) -> tuple[float, dict[str, dict[str, Any]]]:
    """Best known P95 over all runs and, per variant, evaluations to come within ``GAP`` of it, wall times."""
    best = min([r["trace"][-1] if r["trace"][-1] is not None else math.inf for r in runs], default=math.inf)
    summary: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == variant]
        for r in rs:
            r["evals_to_best"] = evals_to([math.inf if v is None else v for v in r["trace"]], best)
        hit = [r["evals_to_best"] for r in rs if r["evals_to_best"] is not None]
        summary[variant] = {
            "runs": len(rs),
            "reached": len(hit),
            "evals_to_best_median": float(np.median(hit)) if hit else None,
            "wall_s_mean": float(np.mean([r["wall_s"] for r in rs])),
            "wall_per_eval_s": float(np.mean([r["wall_s"] / max(r["evals"], 1) for r in rs])),
            "final_p95_mean": float(np.mean([r["trace"][-1] for r in rs])),
            "sim_p95_mean": float(np.mean([r["sim_p95_s"] for r in rs])) if all("sim_p95_s" in r for r in rs) else None,
        }
    return best, summary


def run(ctx: Context) -> dict[str, Any]:
    st = settings(ctx)
    evs = Evaluators(load(SCENARIO, ctx), seed=ctx.seed)
    runs = []
    for variant in VARIANTS:
        for seed in range(ctx.seed, ctx.seed + st["seeds"]):
            row = run_variant(variant, seed, evs, ctx, st)
            runs.append(row)
            print(
                f"[{NAME}] {variant} seed {seed}: {row['evals']} evals, {row['wall_s']:.1f} s, "
                f"best simulated P95 {row['trace'][-1]:.3g}",
                flush=True,
            )
    best, summary = summarise(runs)
    for variant, sm in summary.items():
        record(ctx, NAME, SCENARIO, variant, sm, evaluator="fast" if variant == "fast-objective" else "sim")
    out = {
        "experiment": NAME,
        **ctx.stamp(SCENARIO),
        "settings": st,
        "best_known_p95_s": best,
        "gap": GAP,
        "runs": runs,
        "summary": summary,
    }
    save_json(ctx, NAME, out)
    write_report(ctx, out)
    return out


def write_report(ctx: Context, out: dict[str, Any]) -> None:
    sm = out["summary"]
    text = [
        f"# Ablations ({out['preset']}, {SCENARIO})\n",
        f"Command: `{out['command']}`, seeds from {out['seed']}.\n",
        f"Best known feasible P95 (simulator, over all runs): {out['best_known_p95_s']:.3g} s; "
        f"'evals to best' = evaluations until the best plan so far is within {GAP:.0%} of it.\n",
        table(
            [
                "variant",
                "runs",
                "reached",
                "evals to best (median)",
                "wall s / run",
                "wall s / eval",
                "final best P95 s (sim)",
                "chosen P95 s (sim)",
            ],
            [
                [
                    v,
                    s["runs"],
                    s["reached"],
                    s["evals_to_best_median"],
                    s["wall_s_mean"],
                    s["wall_per_eval_s"],
                    s["final_p95_mean"],
                    s["sim_p95_mean"],
                ]
                for v, s in sm.items()
            ],
        ),
    ]
    save_markdown(ctx, NAME, "\n".join(text))
    fig, ax = new_figure(6.4, 4.0)
    for variant in sm:
        rs = [r for r in out["runs"] if r["variant"] == variant]
        n = min(len(r["trace"]) for r in rs)
        tr = np.median(np.array([[v if v is not None else np.nan for v in r["trace"][:n]] for r in rs], dtype=float), 0)
        ax.plot(np.arange(1, n + 1), tr, label=variant)
    ax.set_yscale("log")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best feasible P95 so far, s (simulator)")
    ax.set_title(f"ablations on {SCENARIO} ({out['preset']})", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(ctx, fig, "ablations")
