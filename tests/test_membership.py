"""`raylm membership`: per-token log-probs from the Scorer, Min-K% Prob and the zlib ratio against a direct float64
computation (one window at a time), and the command end to end."""

from __future__ import annotations

import json
import math
import shutil
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch

from conftest import DATA
import raylm.contamination.membership_run as membership_run
from raylm.cli import main
from raylm.contamination.membership_run import MembershipConfig, run_membership
from raylm.corpus.doc_scoring import DocMembership
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.scoring.membership import min_k_prob, zlib_ratio
from raylm.scoring.scorer import Scorer
from raylm.tasks.queries import native_queries
from reference import float64_copy
from reference_corpus import reference_sequence


def test_min_k_prob_is_the_mean_of_the_lowest_k_percent():
    rng = np.random.default_rng(0)
    for n in (1, 2, 4, 5, 7, 10, 33, 100):
        lp = -rng.gamma(1.5, 2.0, size=n)
        for k in (5.0, 20.0, 50.0, 100.0):
            count = max(1, int(n * k / 100))
            assert min_k_prob(lp, k) == float(np.mean(np.sort(lp)[:count]))
    assert min_k_prob(np.array([-1.0, -5.0, -2.0, -4.0, -3.0]), 20.0) == -5.0
    assert math.isnan(min_k_prob(np.zeros(0))) and math.isnan(zlib_ratio(np.zeros(0), "x"))
    text = "the quick brown fox"
    assert zlib_ratio(np.array([-1.0, -3.0]), text) == 2.0 / len(zlib.compress(text.encode()))


@pytest.fixture(scope="module")
def spec(tiny_llama) -> ModelSpec:
    return ModelSpec(str(tiny_llama), dtype="float32", device="cpu")


def test_token_logprobs_come_from_the_same_pass_and_sum_to_the_loglikelihoods(spec):
    """Packed (a shared prefix) and unpacked, the per-token log-probs of each request sum to its loglikelihood and
    the loglikelihoods and greedy flags are those of a call without them."""
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    rng = np.random.default_rng(1)
    contexts = [[1, *rng.integers(3, 500, 20).tolist()]] * 3 + [[1, *rng.integers(3, 500, 9).tolist()]]
    continuations = [rng.integers(3, 500, n).tolist() for n in (4, 1, 7, 0)]
    for share in (True, False):
        scorer = Scorer(model, 128, share_prefixes=share)
        loglik, greedy = scorer.score(contexts, continuations)
        loglik2, greedy2, per_token = scorer.score(contexts, continuations, token_logprobs=True)
        assert np.array_equal(loglik, loglik2) and np.array_equal(greedy, greedy2)
        assert [len(p) for p in per_token] == [len(c) for c in continuations]
        assert all(p.dtype == np.float64 for p in per_token)
        assert np.allclose([p.sum() for p in per_token], loglik, rtol=0, atol=1e-12)
    assert tokenizer is not None


@torch.inference_mode()
def reference_token_logprobs(model64, tokenizer, text: str, max_length: int) -> list[float]:
    """Every token's log-prob, lm-eval's disjoint rolling windows, one window at a time in float64."""
    sequence = reference_sequence(tokenizer, text)
    out: list[float] = []
    scored = 1
    while scored < len(sequence):
        end = min(len(sequence), scored + max_length)
        window = sequence[max(0, end - max_length - 1):end]
        logprobs = torch.log_softmax(model64(input_ids=torch.tensor([window[:-1]])).logits[0].double(), dim=-1)
        first = len(window) - 1 - (end - scored)
        out.extend(float(logprobs[first + i, t]) for i, t in enumerate(sequence[scored:end]))
        scored = end
    return out


def assert_reference_scores(rows: pa.Table, texts: list[str], k: float, model64, tokenizer, max_length: int) -> None:
    for i, text in enumerate(texts):
        lp = np.array(reference_token_logprobs(model64, tokenizer, text, max_length))
        assert rows["tokens"][i].as_py() == len(lp)
        count = max(1, int(len(lp) * k / 100))
        assert rows["min_k_prob"][i].as_py() == pytest.approx(float(np.sort(lp)[:count].mean()), abs=1e-5)
        assert rows["nll"][i].as_py() == pytest.approx(-math.fsum(lp), rel=1e-6)
        expected_zlib = -lp.mean() / len(zlib.compress(text.encode("utf-8")))
        assert rows["zlib_ratio"][i].as_py() == pytest.approx(expected_zlib, rel=1e-6)


def documents(texts: list[str]) -> pa.Table:
    return pa.table({"task": ["t"] * len(texts), "doc_id": list(range(len(texts))), "text": texts,
                     "path": ["t"] * len(texts)})


def test_scores_match_a_direct_float64_computation(spec):
    """Real documents (WinoGrande sentences, a WikiText page over several 128-token windows): Min-K% at two k and
    the zlib ratio from DocMembership against the float64 reference's token log-probs."""
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    model64 = float64_copy(model)
    texts = native_queries("winogrande", DATA)[:4] + [native_queries("wikitext", DATA)[1][:2500]]
    for k in (20.0, 50.0):
        rows = DocMembership(spec, 128, k)(documents(texts))
        assert_reference_scores(rows, texts, k, model64, tokenizer, 128)
    assert rows["tokens"][4].as_py() > 3 * 128  # the page really spans windows


def test_a_window_longer_than_the_logits_budget_runs_in_pieces(spec):
    """128-token windows under a logits budget of 16 positions (as an 8k window on a 128k vocabulary outgrows the
    real one): the actor's scorer cuts them into pieces over the KV cache, as `raylm ppl`'s does, rather than
    stopping, and the scores are the float64 reference's."""
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    member = DocMembership(spec, 128, 20.0)
    # what a budget of 16 positions' logits gives (Scorer(logits_budget=...))
    member.documents.scorer.max_predicted = 16
    texts = native_queries("winogrande", DATA)[:2] + [native_queries("wikitext", DATA)[1][:1500]]
    rows = member(documents(texts))
    assert rows["tokens"][2].as_py() > 2 * 128
    assert_reference_scores(rows, texts, 20.0, float64_copy(model), tokenizer, 128)


def test_cli_membership_on_a_choice_and_a_rolling_task(ray_session, tiny_llama, tmp_path, capsys):
    """The `raylm membership` command through main(), on the session Ray (test_cli.py runs the entry point in a
    process of its own). Its checkpoint cut back to the first document, as a kill leaves it, the same command
    resumes that one, scores the other and writes the same rows; another k is refused in one line."""
    out = tmp_path / "out"
    capsys.readouterr()
    args = ["membership", "--model", str(tiny_llama), "--tasks", "winogrande,wikitext", "--data-dir", str(DATA),
            "--limit", "1", "--k", "10", "--max-length", "64", "--docs-per-batch", "1", "--checkpoint-every", "0",
            "--no-progress"]
    assert main([*args, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Min-10% mean" in printed and "Weak, model-side evidence" in printed
    assert "0 of 2 documents resumed from checkpoint" in printed
    shutil.copytree(out, tmp_path / "killed")
    parts = sorted((tmp_path / "killed" / "checkpoint" / "shards").iterdir())
    assert len(parts) == 2
    parts[1].unlink()
    (tmp_path / "killed" / "membership.json").unlink()
    assert main([*args, "--output", str(tmp_path / "killed")]) == 0
    assert "1 of 2 documents resumed from checkpoint" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "killed" / "membership.parquet").equals(pq.read_table(out / "membership.parquet"))
    assert main([*args, "--k", "20", "--output", str(tmp_path / "killed")]) == 2
    assert "holds results of a different run (differs in: k)" in capsys.readouterr().err
    report = json.loads((out / "membership.json").read_text())
    rows = pq.read_table(out / "membership.parquet")
    assert rows["task"].to_pylist() == ["winogrande", "wikitext"] and rows["doc_id"].to_pylist() == [0, 0]
    spec = ModelSpec(str(tiny_llama), device="cpu")
    texts = native_queries("winogrande", DATA)[:1] + native_queries("wikitext", DATA)[:1]
    batch = pa.table({"task": rows["task"], "doc_id": rows["doc_id"], "text": texts, "path": rows["task"]})
    # one document per batch, as --docs-per-batch 1 scores them (other batches: other float32 kernel shapes)
    member = DocMembership(spec, 64, 10.0)
    expected = pa.concat_tables([member(batch.slice(i, 1)) for i in range(batch.num_rows)])
    assert rows["min_k_prob"].to_pylist() == pytest.approx(expected["min_k_prob"].to_pylist(), rel=1e-9)
    assert rows["zlib_ratio"].to_pylist() == pytest.approx(expected["zlib_ratio"].to_pylist(), rel=1e-9)
    wg = report["tasks"]["winogrande"]
    assert wg["documents"] == 1 and wg["min_k_prob_mean"] == pytest.approx(expected["min_k_prob"][0].as_py(),
                                                                            rel=1e-9)
    assert report["tasks"]["wikitext"]["tokens"] == rows["tokens"][1].as_py() > 1000
    assert report["k"] == 10.0 and report["config"]["command"] == "membership"
    assert main(["membership", "--model", str(tiny_llama), "--tasks", "winogrande", "--data-dir", str(DATA),
                 "--k", "0", "--output", str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "--k must be a percentage in (0, 100], got 0.0" in capsys.readouterr().err


# Workers cannot import this test module, so its actor class travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class PlacedOnly(DocMembership):
    """Refuses a spec whose device no placement resolved: what the actors were handed when membership passed them
    the model as asked (device "auto", each actor guessing for itself) instead of as placed."""

    def start(self, spec: ModelSpec, *args) -> None:
        if spec.device == "auto":
            raise RuntimeError(f"an actor was handed the unplaced spec (device {spec.device!r})")
        super().start(spec, *args)


def test_the_actors_load_the_model_as_the_placement_resolved_it(ray_session, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(membership_run, "DocMembership", PlacedOnly)
    cfg = MembershipConfig(ModelSpec(str(tiny_llama), max_length=64), ("winogrande",), data_dir=DATA, limit=1,
                           progress=False)
    assert run_membership(cfg, tmp_path / "out")["tasks"]["winogrande"]["documents"] == 1
