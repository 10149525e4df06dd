"""Sums merge to the whole corpus's sums however the stream was cut, and metrics follow from the sums."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from raylm.results.metrics import kl_metrics, ppl_metrics, rolling_metrics
from raylm.results.sums import CorpusSums, corpus_batch_sums, merge


def doc_rows(n: int, kl: bool) -> pa.Table:
    rng = np.random.default_rng(n)
    cols = {name: pa.array(rng.integers(1, 5000, n), pa.int64()) for name in ("tokens", "words", "bytes", "chars")}
    if kl:
        cols.update(kl=rng.random(n) * 1e-3, nll_p=rng.random(n) * 1e4, nll_q=rng.random(n) * 1e4,
                    argmax_disagree=pa.array(rng.integers(0, 50, n), pa.int64()))
    else:
        cols["nll"] = rng.random(n) * 1e4
    return pa.table(cols)


@pytest.mark.parametrize("kl", [False, True])
def test_merged_batch_sums_equal_whole_corpus_sums(kl):
    rows = doc_rows(1000, kl)
    whole = corpus_batch_sums(rows)
    cuts = [0, 1, 7, 300, 301, 999, 1000]
    parts = [corpus_batch_sums(rows.slice(a, b - a)) for a, b in zip(cuts, cuts[1:])]
    collapsed = merge([merge(parts[:3]), merge(parts[3:])])
    for merged in (merge(parts), collapsed):
        assert merged.keys() == whole.keys()
        for key, value in whole.items():
            # Counts add exactly; float sums differ from one fsum over all documents by a rounding per batch.
            assert merged[key] == value if isinstance(value, int) else merged[key] == pytest.approx(value, rel=1e-15)
    assert whole["docs"] == 1000
    # Running sums (a corpus run's, resumed or not) are exact: the same bits however the rows were cut or ordered.
    running = CorpusSums()
    for a, b in reversed(list(zip(cuts, cuts[1:]))):
        running.add(rows.slice(a, b - a))
    assert running.value() == whole


def test_metrics_from_sums():
    sums = {"docs": 2, "tokens": 10, "words": 4, "bytes": 20, "chars": 16, "nll_sum": 25.0}
    m = ppl_metrics(sums)
    assert m["token_perplexity"] == math.exp(2.5) and m["word_perplexity"] == math.exp(25 / 4)
    assert m["bits_per_byte"] == 25 / 20 / math.log(2) and m["bits_per_char"] == 25 / 16 / math.log(2)
    assert m["byte_perplexity"] == math.exp(25 / 20)
    k = kl_metrics({**{x: sums[x] for x in ("docs", "tokens", "words", "bytes", "chars")}, "kl_sum": 0.5,
                    "nll_sum_p": 20.0, "nll_sum_q": 30.0, "argmax_disagree": 3})
    assert k["kl_mean"] == 0.05 and k["argmax_disagree"] == 0.3 and k["argmax_disagree_count"] == 3
    assert k["token_perplexity_p"] == math.exp(2.0) and k["token_perplexity_q"] == math.exp(3.0)


def test_the_task_and_the_corpus_command_report_the_same_perplexities_for_the_same_sums():
    counts = {"docs": 2, "tokens": 10, "words": 4, "bytes": 20}
    task = rolling_metrics({**counts, "nll": 25.0})
    corpus = ppl_metrics({**counts, "chars": 16, "nll_sum": 25.0})
    assert task == {f"{key},none": corpus[key] for key in ("word_perplexity", "byte_perplexity", "bits_per_byte",
                                                            "token_perplexity")}


def test_no_units_give_nan_not_a_division_error():
    m = ppl_metrics({"docs": 1, "tokens": 3, "words": 0, "bytes": 0, "chars": 0, "nll_sum": 2.0})
    assert math.isnan(m["word_perplexity"]) and math.isnan(m["bits_per_byte"]) and m["token_perplexity"] > 1
