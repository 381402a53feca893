"""The published-measurements dataset: complete, cited, covering, and consistent with the catalog."""

from __future__ import annotations

from collections import Counter
from importlib import resources

import pytest

from boute.catalog import builtin_catalog
from boute.perf.dataset import METRICS, MODES, parse_rows, published_rows
from boute.perf.measurements import HELD_OUT, REFERENCE
from boute.perf.rows import build_table

ROWS = published_rows()


def test_size_and_coverage() -> None:
    assert len(ROWS) >= 900
    assert len({r.source_id for r in ROWS}) >= 8
    assert len({r.gpu for r in ROWS}) >= 8
    assert {r.tp for r in ROWS} >= {1, 2, 4, 8} and {r.pp for r in ROWS} >= {1, 2, 4, 8}
    assert {r.metric for r in ROWS if r.in_scope} == set(METRICS) and {r.mode for r in ROWS} == set(MODES)
    # prefill-bound and decode-bound shapes are both there
    assert sum(r.input_len >= 10 * r.output_len for r in ROWS) >= 50
    assert sum(r.output_len >= 10 * r.input_len for r in ROWS) >= 50


def test_every_row_is_cited_and_known_to_the_catalog() -> None:
    cat = builtin_catalog()
    for r in ROWS:
        assert r.source_url.startswith("https://") and r.date, r.id
        assert r.model in cat.models and r.gpu in cat.gpus, r.id
        assert (r.mode == "static") == (r.batch is not None), r.id
        assert (r.mode == "online_rate") == (r.rate_rps is not None), r.id
        assert (r.mode == "concurrency") == (r.concurrency is not None), r.id
        if not r.in_scope:
            assert "OUT OF SCOPE" in r.note, r.id
    assert sorted(r.id for r in ROWS) == list(range(1, len(ROWS) + 1))
    # one published figure per row: no duplicates of the same measurement
    # (model_as_published: v0.13/v0.14 print LLaMA 3 and 3.1 side by side; both are one catalog model)
    keys = Counter((r.source_id, r.model_as_published, r.dtype, r.gpu, r.tp, r.pp, r.mode, r.batch, r.concurrency,
                    r.rate_rps, r.input_len, r.output_len, r.metric) for r in ROWS)  # fmt: skip
    assert max(keys.values()) == 1


def test_every_in_scope_row_fits_the_memory_model() -> None:
    table = build_table([r for r in ROWS if r.in_scope])  # raises naming the row if one does not fit
    assert (table.kv_tokens > 0).all()


def test_measurements_md_rows_are_rows_of_the_dataset() -> None:
    assert len(REFERENCE) == 11 and len(HELD_OUT) == 18
    assert {p.source for p in REFERENCE} <= {r.source_url for r in ROWS}


def test_bad_rows_are_rejected() -> None:
    text = (resources.files("boute.perf") / "data" / "published.csv").read_text().splitlines()
    header, first = text[0], text[1]
    with pytest.raises(ValueError, match="source address"):
        parse_rows("\n".join([header, first.replace("https://", "ftp://")]))
    with pytest.raises(ValueError, match="metric"):
        parse_rows("\n".join([header, first.replace(",output_tokens_per_s,", ",tokens,")]))


def test_readme_documents_every_column() -> None:
    readme = (resources.files("boute.perf") / "data" / "README.md").read_text()
    header = (resources.files("boute.perf") / "data" / "published.csv").read_text().splitlines()[0]
    for col in header.split(","):
        assert f"`{col}`" in readme, col
