"""`raylm probe`: fill-mask top-k against the full softmax, matched sentences, the files a probe file produces,
and bad probe files as one-line errors naming the file and line."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from raylm.cli import main
from raylm.models.spec import ModelSpec
from raylm.probe.file import load_probes
from raylm.probe.run import Prober, fill_masks
from raylm.probe.sentences import build_sentences

PROBES = """\
templates:
  - "The {occupation} said [MASK] was tired."
  - "[MASK] thinks the {occupation} is late."
fill:
  occupation: [nurse, engineer, mechanic]
targets: [he, she, they]
"""


@pytest.fixture(scope="module", params=["tiny_bert", "tiny_roberta"])
def prober(request) -> Prober:
    return Prober(ModelSpec(str(request.getfixturevalue(request.param)), "float32", "cpu"))


def test_top_k_and_the_rest_sum_to_one_and_match_the_full_softmax(prober):
    """Every mask of every text, the model's own mask spelling and the generic [MASK] alike."""
    tok = prober.tokenizer
    texts = ["The capital of France is [MASK].", f"{tok.mask_token} went to the [MASK] with {tok.mask_token}."]
    predictions = fill_masks(prober, texts, 7)
    assert [len(p) for p in predictions] == [1, 3]
    model = AutoModelForMaskedLM.from_pretrained(prober.spec.path).double().eval()
    for text, per_text in zip(texts, predictions):
        ids = tok(text.replace("[MASK]", tok.mask_token), return_tensors="pt")["input_ids"]
        probs = torch.softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        masks = (ids[0] == tok.mask_token_id).nonzero()[:, 0].tolist()
        assert len(masks) == len(per_text)
        for position, prediction in zip(masks, per_text):
            expected = probs[position].topk(7)
            assert [t for t, _ in prediction.top] == tok.convert_ids_to_tokens(expected.indices.tolist())
            assert [p for _, p in prediction.top] == pytest.approx(expected.values.tolist(), rel=1e-5)
            assert math.fsum([p for _, p in prediction.top] + [prediction.rest]) == pytest.approx(1.0, abs=1e-6)


def test_matched_sentences_differ_only_in_the_filled_word_and_targets_only_at_the_mask(prober, tmp_path):
    path = tmp_path / "probes.yaml"
    path.write_text(PROBES)
    tok = prober.tokenizer
    sentences = build_sentences(load_probes(path), tok)
    assert len(sentences) == 2 * 3
    for template in (0, 1):
        group = [s for s in sentences if s.template == template]
        for a, b in zip(group, group[1:]):
            same = min(len(a.ids), len(b.ids))
            prefix = next(i for i in range(same) if a.ids[i] != b.ids[i])
            suffix = next(i for i in range(same) if a.ids[-1 - i] != b.ids[-1 - i])
            for s in (a, b):
                assert tok.decode(s.ids[prefix:len(s.ids) - suffix]).strip() == dict(s.fills)["occupation"]
                assert not prefix <= s.mask < len(s.ids) - suffix
    for s in sentences:
        for target, token in zip(("he", "she", "they"), s.targets):
            filled = tok(s.text.replace(tok.mask_token, target, 1))["input_ids"]
            assert [t for i, t in enumerate(filled) if i != s.mask] == [t for i, t in enumerate(s.ids) if i != s.mask]
            assert filled[s.mask] == token


def test_probe_file_writes_probabilities_log_ratios_and_a_chart(tiny_bert, tmp_path, capsys):
    path, out = tmp_path / "probes.yaml", tmp_path / "out"
    path.write_text(PROBES)
    assert main(["probe", "--model", str(tiny_bert), "--probes", str(path), "--output", str(out), "--top-k", "4",
                 "--dtype", "float32", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "| The nurse said [MASK] was tired. |" in printed and "log_ratio_she_vs_he" in printed
    rows = list(csv.DictReader((out / "probe.csv").open()))
    assert len(rows) == 6 * 3
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert len(summary) == 6
    prober = Prober(ModelSpec(str(tiny_bert), "float32", "cpu"))
    for row in summary:
        (best,) = fill_masks(prober, [row["sentence"]], 1)[0][0].top
        scores = {r["target"]: float(r["log_probability"]) for r in rows if r["sentence"] == row["sentence"]}
        assert float(row["log_ratio_she_vs_he"]) == pytest.approx(scores["she"] - scores["he"], abs=1e-6)
        assert float(row["logp_they"]) == pytest.approx(scores["they"], abs=1e-6)
        assert best[1] >= max(math.exp(v) for v in scores.values()) * (1 - 1e-6)
    topk = list(csv.DictReader((out / "topk.csv").open()))
    assert len(topk) == 6 * (4 + 1)
    assert (out / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["targets"] == ["he", "she", "they"] and len(results["summary"]) == 6


def test_probe_file_keeps_an_eval_runs_results_in_the_shared_default_directory(tiny_bert, tmp_path, capsys):
    """`raylm probe` defaults to raylm-out/, where an eval may have been told to write: a probe file never writes
    over an eval's results.json (as ppl and kl never do), and a probe's own results are replaced by its rerun."""
    path, out = tmp_path / "probes.yaml", tmp_path / "raylm-out"
    path.write_text(PROBES)
    out.mkdir()
    evaluated = json.dumps({"results": {"hellaswag": {}}, "config": {"versions": {"raylm": "0.1.0"}}})
    (out / "results.json").write_text(evaluated)
    args = ["probe", "--model", str(tiny_bert), "--probes", str(path), "--output", str(out), "--device", "cpu"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (f"raylm: error: '{out / 'results.json'}' holds the results of "
                                               "`raylm eval`; use another --output")
    assert (out / "results.json").read_text() == evaluated and not (out / "probe.csv").exists()
    (out / "results.json").unlink()
    assert main(args) == 0 and main(args) == 0
    assert json.loads((out / "results.json").read_text())["config"]["command"] == "probe"


@pytest.mark.parametrize("text,line,pattern", [
    ('templates: ["The {occupation} said it."]\nfill:\n  occupation: [nurse]\ntargets: [he, she]\n', 1,
     r"templates\[0\]: 'The nurse said it\.' has no mask"),
    ('templates:\n  - "[MASK] and [MASK] left."\ntargets: [he, she]\n', 2, r"templates\[0\]: .* has 2 masks"),
    ('templates:\n  - "[MASK] left."\ntargets:\n  - he\n  - unbelievably\n', 5,
     r"targets\[1\]: 'unbelievably' does not read as one token .*\(it reads as \d+: un ##b"),
    ('templates: []\ntargets: [he, she]\n', 1, r"templates: must not be empty"),
    ('templates:\n  - "[MASK] left."\nfill:\n  name: []\ntargets: [he, she]\n', 4, r"fill\.name: must not be empty"),
    ('templates:\n  - "[MASK] met {name}."\ntargets: [he, she]\n', 2,
     r"templates\[0\]: uses \{name\}, which 'fill' does not define"),
    ('templates:\n  - "[MASK] left."\ntargets: [he]\n', 3, r"targets\[0\]: needs at least two targets"),
    ('templates:\n  - "[MASK] left."\n', 1, r"targets: missing"),
])
def test_bad_probe_file_is_one_line_naming_the_file_and_line(tiny_bert, tmp_path, capsys, text, line, pattern):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["probe", "--model", str(tiny_bert), "--probes", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"raylm: error: {path}: line {line}: ")
    assert re.search(pattern, err), err
    assert not (tmp_path / "out" / "probe.csv").exists()


def test_probe_refuses_a_causal_model_and_a_text_without_mask(tiny_gpt2, tiny_bert, capsys):
    assert main(["probe", "--model", str(tiny_gpt2), "--text", "Hello [MASK]."]) == 2
    assert "raylm probe needs a masked language model" in capsys.readouterr().err
    assert main(["probe", "--model", str(tiny_bert), "--text", "No mask here."]) == 2
    assert "has no mask" in capsys.readouterr().err


def test_text_probe_prints_each_mask(tiny_roberta, capsys):
    assert main(["probe", "--model", str(tiny_roberta), "--text", "<mask> saw [MASK].", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "(mask 1 of 2)" in out and "(mask 2 of 2)" in out and out.count("(rest)") == 2
    assert AutoTokenizer.from_pretrained(tiny_roberta).mask_token == "<mask>"
