"""``boute router train|eval``: train the learned router on a quality profile and measure it.

Tiers are the profile's models ordered by measured mean quality (small -> large) unless ``--tiers a,b``
names them, so a profile with two model columns needs no other option.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # annotations only: the quality package loads when a command runs
    from boute.quality.profiles import QualityProfile

router_app = typer.Typer(help="Train and evaluate the learned router.", no_args_is_help=True)


def _tiers(profile: QualityProfile, tiers: str | None) -> list[str]:
    from boute.errors import SpecError

    models = list(profile.models)
    if tiers is None:
        q = profile.mean_quality()
        chosen = sorted(models, key=lambda m: q[m])
    else:
        chosen = [t.strip() for t in tiers.split(",") if t.strip()]
        for t in chosen:
            if t not in models:
                raise SpecError("--tiers", None, f"'{t}' is not a model in the profile (has: {', '.join(models)})")
    if len(chosen) < 2:
        raise SpecError("--tiers", None, f"need at least 2 tiers, got {len(chosen)}")
    return chosen


@router_app.command("train")
def train_cmd(
    profile: str = typer.Option(..., "--profile", help="quality profile: builtin:gsm8k, builtin:mt-bench or a file"),
    out: Path = typer.Option(..., "--out", help="router file to write (weights); metadata goes to OUT.json"),
    tiers: str | None = typer.Option(None, "--tiers", help="comma-separated models, small to large"),
    fmt: str = typer.Option("auto", "--format", help="auto, routellm-csv, routerbench, mtbench-jsonl or jsonl"),
    seed: int = typer.Option(0, "--seed", help="train/test split seed"),
    test_fraction: float = typer.Option(0.3, "--test-fraction", help="share of queries held out"),
    good_threshold: float = typer.Option(0.5, "--good-threshold", help="normalised score that counts as good"),
    embedder: str = typer.Option(
        "static",
        "--embedder",
        help="static: MiniLM distilled to a token table (~0.2 ms/prompt, no torch at run time; the table is "
        "saved beside OUT); minilm: the transformer (~15-20 ms/prompt)",
    ),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="embedding cache (default $BOUTE_CACHE_DIR)"),
) -> None:
    """Embed the profile's prompts, train the router on a seeded split, save it; print a JSON summary."""
    from boute.errors import SpecError
    from boute.quality.profiles import load_profile
    from boute.quality.router import EMBEDDERS, train_router

    if embedder not in EMBEDDERS:
        raise SpecError("--embedder", None, f"must be one of {', '.join(EMBEDDERS)}, got '{embedder}'")
    if not 0 < test_fraction < 1:  # checked before a first-time distillation (minutes), not after
        raise SpecError("--test-fraction", None, f"must be in (0, 1), got {test_fraction}")
    prof = load_profile(profile, fmt)
    models = _tiers(prof, tiers)
    if embedder == "static":
        from boute.quality.static_embed import load_static

        t0 = time.perf_counter()
        static = load_static(cache_dir=cache_dir)  # distils on first use (~2 min), then cached
        t1 = time.perf_counter()
        x = static.embed(prof.prompts)
        stats: dict[str, object] = {
            "kind": "static",
            "load_or_distill_s": t1 - t0,
            "distill_s": static.info.get("distill_seconds"),
            "embed_s": time.perf_counter() - t1,
            "n": len(prof),
        }
        router, train, test = train_router(
            prof, models, x, seed=seed, test_fraction=test_fraction, good_threshold=good_threshold, static=static
        )
    else:
        from boute.quality.embed import Embedder

        emb = Embedder(cache_dir)
        x = emb.embed(prof.prompts)
        stats = {"kind": "minilm", **emb.last_stats}
        router, train, test = train_router(
            prof, models, x, seed=seed, test_fraction=test_fraction, good_threshold=good_threshold
        )
    router.save(out)
    summary = {
        "router": str(out),
        "metadata": str(out) + ".json",
        "files": [str(f) for f in router.files()],
        "embedder": embedder,
        "tiers": models,
        "n_train": int(len(train)),
        "n_test": int(len(test)),
        "test_auc": router.metadata.get("test_auc"),
        "train_auc": router.metadata.get("train_auc"),
        "C": router.metadata.get("C"),
        "embedding": {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()},
    }
    typer.echo(json.dumps(summary))


@router_app.command("eval")
def eval_cmd(
    profile: str = typer.Option(..., "--profile", help="quality profile: builtin:gsm8k, builtin:mt-bench or a file"),
    router: Path = typer.Option(..., "--router", help="router file written by `boute router train`"),
    tiers: str | None = typer.Option(None, "--tiers", help="comma-separated models, small to large"),
    fmt: str = typer.Option("auto", "--format", help="auto, routellm-csv, routerbench, mtbench-jsonl or jsonl"),
    cascade: bool = typer.Option(False, "--cascade", help="also evaluate the cascade with the offline verifier"),
    points: int = typer.Option(21, "--points", help="points on the printed curve (the summary uses 101)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="embedding cache (default $BOUTE_CACHE_DIR)"),
) -> None:
    """Quality vs share of large-model calls on held-out queries, with APGR / CPT(50%) / CPT(80%)."""
    import numpy as np

    from boute.quality.build import build_quality_model
    from boute.quality.metrics import at_shares, evaluate
    from boute.quality.profiles import load_profile
    from boute.specs.plan import ROUTING_MODES

    prof = load_profile(profile, fmt)
    models = _tiers(prof, tiers)
    qm = build_quality_model(prof, models, router_path=router, cache_dir=cache_dir)
    res = evaluate(qm, modes=ROUTING_MODES if cascade else ("preroute",))
    grid = np.linspace(0.0, 1.0, max(points, 2))
    curve = [
        {"large_share": round(float(s), 4)}
        | {n: round(float(np.interp(s, c["share"], c["quality"])), 4) for n, c in res["curves"].items()}
        for s in grid
    ]
    out = {
        "profile": prof.source,
        "router": str(router),
        "tiers": models,
        "n_test": res["n_test"],
        "quality_small": round(res["quality_small"], 4),
        "quality_large": round(res["quality_large"], 4),
        "router_test_auc": qm.info.get("router_test_auc"),
        **{k: _round(v) for k, v in res["summary"]["router"].items()},
        "summary": {n: {k: _round(v) for k, v in s.items()} for n, s in res["summary"].items()},
        "at_large_share": {n: {k: round(v, 4) for k, v in d.items()} for n, d in at_shares(res).items()},
        "curve": curve,
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(
        f"[bold]{prof.source}[/]: {models[0]} ({out['quality_small']}) -> {models[-1]} ({out['quality_large']}), {out['n_test']} held-out queries"
    )
    t = Table("policy", "APGR", "CPT(50%)", "CPT(80%)", *(f"q@{k}" for k in out["at_large_share"]["random"]))
    for name, s in out["summary"].items():
        t.add_row(
            name,
            *(_fmt(s[k]) for k in ("apgr", "cpt50", "cpt80")),
            *(f"{v:.3f}" for v in out["at_large_share"][name].values()),
        )
    con.print(t)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def register(app: typer.Typer) -> None:
    app.add_typer(router_app, name="router")
