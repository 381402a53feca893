"""The static (distilled) router: training, file layout + hashes, torch-free loading, scoring, quality.

The distilled table comes from the cache ($BOUTE_CACHE_DIR or ~/.cache/boute/static): the first run on a
machine distils the packaged MiniLM once (~2 minutes on two busy cores), later runs read it back. Timing
lives in bench/bench_router_speed.py, not here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from boute.errors import SpecError
from boute.quality import load_profile, load_router
from boute.quality.build import build_quality_model
from boute.quality.metrics import evaluate
from boute.quality.router import ROUTER_FORMAT, train_router
from boute.quality.static_embed import StaticEmbedder, load_static
from tests.cli import run_cli

MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"
ODD = ["", "   ", "[UNK] [CLS]", "x" * 200_000, "Wie viele Äpfel? 🍎🍎 3/4 of $12.50 = 9.375 (75 %)", "\n\n?"]


@pytest.fixture(scope="module")
def static() -> StaticEmbedder:
    return load_static()


@pytest.fixture(scope="module")
def gsm8k():
    return load_profile("builtin:gsm8k")


@pytest.fixture(scope="module")
def saved(static: StaticEmbedder, gsm8k, tmp_path_factory: pytest.TempPathFactory) -> Path:
    router, _, _ = train_router(gsm8k, [MIXTRAL, GPT4], static=static, seed=0)
    return router.save(tmp_path_factory.mktemp("static") / "router.npz")


def test_static_router_files_and_hashes(saved: Path) -> None:
    import hashlib

    r = load_router(saved)
    assert r.embedder_kind == "static" and r.metadata["format"] == ROUTER_FORMAT
    names = [f.name for f in r.files()]
    assert names[:2] == ["router.npz", "router.npz.json"]
    assert re.fullmatch(r"static-[0-9a-f]{16}\.npy", names[2]) and names[3] == names[2][:-4] + ".tokenizer.json"
    meta = json.loads(saved.with_name("router.npz.json").read_text())
    assert set(meta["files"]) == {"weights", "table", "tokenizer"}
    for entry in meta["files"].values():
        f = saved.with_name(entry["name"])
        assert hashlib.sha256(f.read_bytes()).hexdigest() == entry["sha256"]
    assert meta["embedder"]["kind"] == "static" and meta["embedder"]["dim"] == r.static.dim
    assert meta["embedder"]["settings"]["pca_dims"] == r.static.dim
    # the plan bundle copies files() elsewhere: the router loads from the new place, same scores
    dest = saved.parent / "bundle"
    dest.mkdir(exist_ok=True)
    for f in r.files():
        (dest / f.name).write_bytes(f.read_bytes())
    prompts = ["How many eggs are left?", "Write a poem about routers."]
    np.testing.assert_array_equal(load_router(dest / "router.npz").score(prompts), r.score(prompts))


@pytest.mark.timeout(120)  # starts processes
def test_static_router_loads_and_scores_without_torch(saved: Path, gsm8k) -> None:
    prompts = list(gsm8k.prompts[:20]) + ODD
    code = (
        "import json, sys\n"
        "from boute.quality import load_router\n"
        f"r = load_router({str(saved)!r})\n"
        "p = json.load(sys.stdin)\n"
        "s = r.score(p).tolist(); one = [r.score_one(x) for x in p]\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sklearn', 'model2vec') if m in sys.modules)\n"
        "print(json.dumps({'score': s, 'one': one, 'heavy': heavy}))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(prompts), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["heavy"] == []
    np.testing.assert_allclose(out["score"], load_router(saved).score(prompts), rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["one"], out["score"], rtol=0, atol=1e-12)


def test_score_one_equals_score(saved: Path, gsm8k) -> None:
    r = load_router(saved)
    mt = load_profile("builtin:mt-bench")
    prompts = list(gsm8k.prompts[::40]) + list(mt.prompts[::8]) + ODD
    batch = r.score(prompts)
    one = np.array([r.score_one(p) for p in prompts])
    np.testing.assert_allclose(one, batch, rtol=0, atol=1e-12)
    assert batch.shape == (len(prompts),) and batch.min() >= 0 and batch.max() <= 1
    assert len(set(np.round(batch[: -len(ODD)], 9))) > len(batch) // 2  # scores differ between prompts
    # score_embeddings on the router's own embeddings is the same function (what build_quality_model uses)
    np.testing.assert_allclose(r.score_embeddings(r.embed(prompts), prompts), batch, rtol=0, atol=1e-12)


def test_static_embedding_is_model2vecs(static: StaticEmbedder) -> None:
    """The hand-written fast path computes what model2vec's own StaticModel.encode computes."""
    from model2vec import StaticModel
    from tokenizers import Tokenizer

    ref = StaticModel(vectors=static.table, tokenizer=Tokenizer.from_str(static.tokenizer_json), normalize=True)
    texts = ["Natalia sold clips to 48 of her friends in April.", "Compose a travel blog post about Hawaii.", *ODD]
    ours = static.embed(texts)
    np.testing.assert_allclose(ours, ref.encode(texts).astype(np.float32), atol=2e-3)  # model2vec: float16 out
    np.testing.assert_array_equal(np.stack([static.embed_one(t) for t in texts]), ours)
    np.testing.assert_allclose(np.linalg.norm(ours[:2], axis=1), 1.0, atol=1e-5)
    assert not static.embed([""]).any() and np.isfinite(ours).all()  # no token -> zero vector, no NaN


def test_models_saved_in_one_folder_share_one_table(saved: Path, static: StaticEmbedder, gsm8k, tmp_path: Path) -> None:
    """A ladder, another ladder and a multi router saved side by side: one table and one tokenizer on disk, named
    by their content and written once (the cache's routers/ held a 15 MB copy per router before); each model
    loads, and a damaged shared table is refused by every model that names it."""
    from boute.quality.multi import load_multi_router, train_multi_router

    ladder = load_router(saved)
    a = ladder.save(tmp_path / "a.npz")
    table = next(tmp_path.glob("static-*.npy"))
    written = table.stat().st_ino
    b = ladder.save(tmp_path / "b.npz")
    train = np.setdiff1d(np.arange(len(gsm8k)), ladder.metadata["split"]["test_indices"])
    head = (ladder.head, float(ladder.metadata["C"]))
    multi = train_multi_router(gsm8k, [MIXTRAL, GPT4], train, static, seed=0, level_head=head).save(tmp_path / "m.npz")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("static-")) == [
        table.name,
        table.name[:-4] + ".tokenizer.json",
    ]
    assert table.stat().st_ino == written  # found with the same content: not written again
    assert load_router(a).files()[2:] == load_router(b).files()[2:] == load_multi_router(multi.path).files()[2:]
    np.testing.assert_array_equal(load_router(b).score(gsm8k.prompts[:50]), ladder.score(gsm8k.prompts[:50]))
    bad = bytearray(table.read_bytes())
    bad[-3] ^= 0x01
    table.write_bytes(bytes(bad))
    for load, path in ((load_router, a), (load_router, b), (load_multi_router, tmp_path / "m.npz")):
        with pytest.raises(SpecError, match=r"files\.table\.sha256: hash mismatch"):
            load(path)
    ladder.save(tmp_path / "c.npz")  # a save finds the damaged file and writes the table again
    load_router(a)


def test_tampered_or_missing_files_are_refused(saved: Path, tmp_path: Path) -> None:
    for f in load_router(saved).files():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    r = tmp_path / "router.npz"
    table, tok = (tmp_path / f.name for f in load_router(saved).files()[2:])
    good = table.read_bytes()
    bad = bytearray(good)
    bad[-3] ^= 0x01  # one bit of one float16
    table.write_bytes(bytes(bad))
    with pytest.raises(SpecError) as exc:
        load_router(r)
    msg = str(exc.value)
    assert "\n" not in msg and table.name in msg and "files.table.sha256" in msg and "mismatch" in msg
    table.write_bytes(good)
    load_router(r)
    tok.rename(tmp_path / "elsewhere.json")
    with pytest.raises(SpecError, match=rf"{re.escape(tok.name)}: files\.tokenizer: file not found"):
        load_router(r)
    (tmp_path / "elsewhere.json").rename(tok)
    w = r.read_bytes()
    r.write_bytes(w + b"\0")
    with pytest.raises(SpecError, match=r"files\.weights\.sha256: hash mismatch"):
        load_router(r)
    r.write_bytes(w)
    meta_file = tmp_path / "router.npz.json"
    meta = json.loads(meta_file.read_text())
    for field, value, pattern in (
        ("name", "../router.npz.static.npy", r"files\.table\.name: must be a file name"),
        ("sha256", "abc", r"files\.table\.sha256: must be a 64-hex-digit"),
    ):
        m = json.loads(json.dumps(meta))
        m["files"]["table"][field] = value
        meta_file.write_text(json.dumps(m))
        with pytest.raises(SpecError, match=pattern):
            load_router(r)
    m = json.loads(json.dumps(meta))
    del m["files"]["table"]
    meta_file.write_text(json.dumps(m))
    with pytest.raises(SpecError, match=r"files\.table: missing"):
        load_router(r)


def test_legacy_minilm_router_still_loads(tmp_path: Path) -> None:
    """A boute-router/1 file (MiniLM, no ``files`` list), as written before the static embedder."""
    mt = load_profile("builtin:mt-bench")
    emb = np.random.default_rng(0).normal(size=(len(mt), 384)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    router, _, _ = train_router(mt, [MIXTRAL, GPT4], emb)
    path = router.save(tmp_path / "old.npz")
    meta = json.loads((tmp_path / "old.npz.json").read_text())
    meta["format"], meta["embedder"] = "boute-router/1", {"max_tokens": 256, "truncate": "right"}
    del meta["files"]
    (tmp_path / "old.npz.json").write_text(json.dumps(meta))
    old = load_router(path)
    assert old.embedder_kind == "minilm" and old.static is None
    assert [f.name for f in old.files()] == ["old.npz", "old.npz.json"]
    np.testing.assert_allclose(
        old.score_embeddings(emb, mt.prompts), router.score_embeddings(emb, mt.prompts), rtol=0, atol=1e-12
    )
    meta["embedder"]["kind"] = "static"
    (tmp_path / "old.npz.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match="format"):
        load_router(path)


def test_static_router_apgr_on_held_out(saved: Path, gsm8k) -> None:
    """Seed-0 held-out GSM8K, computed as `boute router eval` does. Bound: today's MiniLM router reaches
    0.562 on this split (docs/quality.md); the issue allows 0.01 less. Measured for the static router: 0.588."""
    qm = build_quality_model(gsm8k, [MIXTRAL, GPT4], router_path=saved)
    assert qm.n_test == 396
    s = evaluate(qm)["summary"]
    assert s["router"]["apgr"] >= 0.552, s["router"]
    assert load_router(saved).metadata["test_auc"] > 0.55


def test_cli_trains_static_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str], static) -> None:
    out = tmp_path / "mt.npz"
    args = ["router", "train", "--profile", "builtin:mt-bench", "--out", str(out), "--test-fraction", "0.5"]
    assert run_cli(args).returncode == 0
    train = json.loads(capsys.readouterr().out)
    assert train["embedder"] == "static" and train["n_test"] == 80
    names = [Path(f).name for f in train["files"]]
    assert names[:2] == ["mt.npz", "mt.npz.json"] and re.fullmatch(r"static-[0-9a-f]{16}\.npy", names[2])
    assert run_cli(["router", "eval", "--profile", "builtin:mt-bench", "--router", str(out), "--json"]).returncode == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["n_test"] == 80 and 0.0 < ev["apgr"] < 1.2
    assert run_cli([*args, "--embedder", "bert"]).returncode == 2
    err = capsys.readouterr().err
    assert "--embedder" in err and "static, minilm" in err and err.count("\n") == 1


def test_the_word_cache_path_tokenises_exactly_as_the_tokenizer(static: StaticEmbedder, gsm8k) -> None:
    """Printable-ASCII prompts skip the tokenizer call (per-word cache); every profile prompt and some odd
    texts must still get the tokenizer's own ids, truncation and unknown-token handling included."""
    mt = load_profile("builtin:mt-bench")
    odd = [*ODD, "snake_case and CamelCase\tTABS\r\nend", "a" * 150 + " b", "x_y__z 1,000.50 A-B (c)! ~`@#", "w " * 700]
    texts = [*gsm8k.prompts, *mt.prompts, *odd]

    def reference(t: str) -> list[int]:
        ids = static._tok.encode(t[: static._max_chars], add_special_tokens=False).ids
        return [i for i in ids if i != static._unk]

    mismatched = [t[:60] for t in texts if static.ids(t) != reference(t)]
    assert mismatched == []


def test_unicode_spaces_and_punctuation_take_the_word_cache_and_tokenise_alike(static: StaticEmbedder) -> None:
    """Typed text's curly quotes, dashes and no-break spaces stay on the word-cache path; random texts mixing
    them with ASCII words, and with characters that must go to the tokenizer (accented letters, symbols,
    combining marks, control and format characters), all get the tokenizer's own ids."""
    emb = StaticEmbedder(static.table, static.tokenizer_json, max_tokens=static.max_tokens)
    fast = [chr(c) for c in range(0x80, 0x3100) if emb.word_char(chr(c))]
    # ’ “ — no-break space, ideographic space, line separator, ¿, a CJK ideograph (padded with spaces)
    assert {"\u2019", "\u201c", "\u2014", "\u00a0", "\u3000", "\u2028", "\u00bf"} - set(fast) == set()
    assert emb.word_char("\u4e2d")
    # é Ä € ¾ ß ﬁ Ⅻ, a combining accent, zero-width space, NEL (U+2E53, punctuation since Unicode 14 and a
    # letter to the pinned tokenizers' tables, is left out: its answer is the tokenizer build's, not a rule)
    slow = ["é", "Ä", "€", "¾", "ß", "ﬁ", "Ⅻ", "\u0301", "\u200b", "\x85"]
    assert not any(map(emb.word_char, slow))
    assert len(emb._chars) > 10_000  # every character probed once, then remembered
    rng = np.random.default_rng(7)
    words = ["Natalia", "sold", "48", "clips", "x_y", "3.5", "don", "t", "A-B", "(c)", "?", "well", "UNK"]

    def text(pool: list[str]) -> str:
        parts = [rng.choice(words) if rng.random() < 0.6 else rng.choice(pool) for _ in range(rng.integers(1, 40))]
        return "".join(p + (" " if rng.random() < 0.5 else "") for p in parts)

    texts = [text(fast) for _ in range(400)] + [text(fast) + str(rng.choice(slow)) + text(fast) for _ in range(400)]
    sent: list[str] = []

    class Spy:  # records what reaches the tokenizer whole (the word cache sends it single words)
        def __init__(self, tok: object) -> None:
            self.tok = tok

        def encode(self, t: str, **kw: object) -> object:
            sent.append(t)
            return self.tok.encode(t, **kw)  # type: ignore[attr-defined]

    emb._chars.clear()
    ref = emb._tok
    emb._tok = Spy(ref)  # type: ignore[assignment]

    def reference(t: str) -> list[int]:
        ids = ref.encode(t[: emb._max_chars], add_special_tokens=False).ids
        return [i for i in ids if i != emb._unk]

    mismatched = [t[:60] for t in texts if emb.ids(t) != reference(t)]
    assert mismatched == []
    whole = set(sent) & set(texts)
    assert not whole & set(texts[:400])  # every text of spaces and punctuation took the word cache
    assert whole == set(texts[400:])  # a text with one other character goes to the tokenizer whole
