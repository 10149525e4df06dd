"""`raylm ppl` on a masked LM: pseudo-perplexity over a streamed corpus, each token scored once, labelled as such."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA
from reference_masked import reference_pll
from transformers import AutoModelForMaskedLM, AutoTokenizer

from raylm.corpus.doc_scoring import DocPseudoPerplexity
from raylm.corpus.run import CorpusConfig, run_corpus
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.requests.masked import UNSCORED


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, list[str]]:
    """Ten WikiText lines, each shorter than one 128-token window."""
    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip() and len(line) < 250][:10]
    path = tmp_path_factory.mktemp("corpus") / "lines.parquet"
    pq.write_table(pa.table({"text": lines}), path)
    return str(path), lines


@pytest.fixture(scope="module")
def spec(tiny_bert) -> ModelSpec:
    return ModelSpec(str(tiny_bert), dtype="float32", device="cpu")


def run(spec, data, out, **kwargs):
    result = run_corpus(CorpusConfig(spec, data, progress=False, **kwargs), out)
    return result, json.loads((out / "results.json").read_text()), pq.read_table(out / "samples" / "pseudo_ppl.parquet")


def test_pseudo_perplexity_is_labelled_and_equals_the_reference(ray_session, spec, corpus, tmp_path):
    """Lines shorter than the model's 128 tokens are one window each: [CLS] line [SEP], every token scored."""
    data, lines = corpus
    result, results, docs = run(spec, data, tmp_path)
    assert set(results["results"]) == {"pseudo_ppl"} and results["config"]["scorer"] == "mlm"
    assert results["config"]["pll"] == "original" and result.stride == 126
    m = results["results"]["pseudo_ppl"]
    assert "nll_sum" not in m and "token_perplexity" not in m
    assert m["token_pseudo_perplexity"] == pytest.approx(math.exp(-m["pll_sum"] / m["tokens"]))
    assert m["bits_per_byte"] == pytest.approx(-m["pll_sum"] / m["bytes"] / math.log(2))
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    model64 = AutoModelForMaskedLM.from_pretrained(spec.path).double().eval()
    for line, pll, tokens in zip(lines, docs["pll"].to_pylist(), docs["tokens"].to_pylist()):
        encoded = tokenizer(line, add_special_tokens=False)
        ids, words = encoded["input_ids"], [UNSCORED if w is None else w for w in encoded.word_ids()]
        assert len(ids) < 126 and tokens == len(ids)
        expected, _ = reference_pll(model64, [tokenizer.cls_token_id], ids, [tokenizer.sep_token_id], words,
                                    tokenizer.mask_token_id, "original")
        assert pll == pytest.approx(expected, rel=1e-5)
    assert m["pll_sum"] == pytest.approx(math.fsum(docs["pll"].to_pylist()), rel=1e-12)


def test_short_windows_score_every_token_once_as_in_process(ray_session, spec, corpus, tmp_path):
    data, lines = corpus
    word_l2r = ModelSpec(spec.path, "float32", "cpu", pll="word-l2r")
    result, results, docs = run(word_l2r, data, tmp_path, max_length=24, stride=24)
    assert result.stride == 22  # the whole max length asked for: every window's room, less CLS and SEP
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    assert docs["tokens"].to_pylist() == [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in lines]
    local = DocPseudoPerplexity(word_l2r, 24, 22)(pa.table({"text": lines, "path": ["mem"] * len(lines)}))
    assert docs["pll"].to_pylist() == pytest.approx(local["pll"].to_pylist(), rel=1e-5)
    assert results["config"]["pll"] == "word-l2r"
    strided, _, strided_docs = run(word_l2r, data, tmp_path / "strided", max_length=24, stride=5)
    assert strided.stride == 5 and strided_docs["tokens"].to_pylist() == docs["tokens"].to_pylist()


def test_kl_refuses_a_masked_model(spec, tiny_gpt2, corpus, tmp_path):
    with pytest.raises(RaylmError, match="raylm kl compares causal LMs"):
        run_corpus(CorpusConfig(ModelSpec(str(tiny_gpt2)), corpus[0], model_b=spec, progress=False), tmp_path)
