"""`raylm ppl` / `raylm kl` over streamed corpora on Ray Data: formats, windows, references, errors."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import DATA, run_cli
from reference import float64_copy
from reference_corpus import reference_strided_nll
from task_requests import build_task_requests
from transformers import AutoModelForCausalLM, AutoTokenizer

from raylm.cli import main
from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.corpus.doc_scoring import DocPerplexity
from raylm.corpus.resume import CorpusCheckpoint, batch_key, tagged
from raylm.corpus.run import CorpusConfig, results_dict, run_corpus
from raylm.errors import RaylmError
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.scoring.scorer import Scorer
from raylm.storage.ownership import is_raylm_parquet
from raylm.cluster.scheduler import SHARD_DELAY_ENV
from raylm.storage.location import location
from raylm.storage.lock import LOCK_FILE
from raylm.storage.ownership import CHECKPOINT_DIR
from raylm.tasks.wikitext import load_docs as wikitext_docs

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3

COUNTS = ("docs", "tokens", "words", "bytes", "chars")


def wikitext_lines(n: int) -> list[str]:
    lines = (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:n]


def write_shards(directory, texts: list[str], fmt: str, shards: int = 2) -> str:
    """The same documents, in order, as `shards` files of one format; returns a glob over them."""
    directory.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(texts) / shards)
    for i in range(shards):
        part = texts[i * size:(i + 1) * size]
        path = directory / f"part-{i}.{fmt}"
        if fmt == "parquet":
            pq.write_table(pa.table({"id": list(range(len(part))), "body": part}), path)
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps({"body": t, "id": j}) + "\n" for j, t in enumerate(part)))
        else:
            path.write_text("".join(t + "\n" for t in part), encoding="utf-8")
    return str(directory / f"part-*.{fmt}")


def run(spec: ModelSpec, data: str, out, **kwargs):
    result = run_corpus(CorpusConfig(spec, data, progress=False, **kwargs), out)
    kind = "kl" if kwargs.get("model_b") else "ppl"
    return result, pq.read_table(out / "samples" / f"{kind}.parquet")


@pytest.fixture(scope="module")
def spec(tiny_llama, ray_restarted_after) -> ModelSpec:
    return ModelSpec(str(tiny_llama), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return wikitext_lines(40)


@pytest.fixture(scope="module")
def parquet_run(spec, lines, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parquet")
    data = write_shards(tmp / "data", lines, "parquet")
    return data, *run(spec, data, tmp / "out", text_column="body", max_length=64)


@pytest.mark.parametrize("fmt", ["jsonl", "txt"])
def test_same_documents_give_identical_metrics_in_every_format(spec, lines, parquet_run, fmt, tmp_path):
    _, expected, expected_docs = parquet_run
    data = write_shards(tmp_path / "data", lines, fmt)
    result, docs = run(spec, data, tmp_path / "out", text_column="body" if fmt == "jsonl" else "text", max_length=64)
    assert {k: result.metrics[k] for k in COUNTS} == {k: expected.metrics[k] for k in COUNTS}
    assert result.metrics["docs"] == len(lines)
    assert result.metrics["nll_sum"] == pytest.approx(expected.metrics["nll_sum"], rel=1e-9)
    assert docs["nll"].to_pylist() == pytest.approx(expected_docs["nll"].to_pylist(), rel=1e-8)
    assert docs["tokens"].to_pylist() == expected_docs["tokens"].to_pylist()


def test_results_file_and_per_document_samples(parquet_run, lines, tmp_path_factory):
    _, result, docs = parquet_run
    assert docs["doc"].to_pylist() == list(range(len(lines)))
    assert "prefix_sharing" not in docs.column_names  # the actors' verdict goes to results.json only
    assert results_dict(result)["config"]["prefix_sharing"] == "packed (proven family: LlamaForCausalLM, sdpa)"
    assert docs["words"].to_pylist() == [len(t.split()) for t in lines]
    assert docs["bytes"].to_pylist() == [len(t.encode()) for t in lines]
    assert result.metrics["nll_sum"] == pytest.approx(math.fsum(docs["nll"].to_pylist()), rel=1e-12)
    m = result.metrics
    assert m["token_perplexity"] == pytest.approx(math.exp(m["nll_sum"] / m["tokens"]))
    assert m["word_perplexity"] == pytest.approx(math.exp(m["nll_sum"] / m["words"]))
    assert m["bits_per_byte"] == pytest.approx(m["nll_sum"] / m["bytes"] / math.log(2))
    assert m["bits_per_char"] == pytest.approx(m["nll_sum"] / m["chars"] / math.log(2))
    assert m["byte_perplexity"] == pytest.approx(2 ** m["bits_per_byte"])


def test_stride_equal_to_max_length_is_the_wikitext_tasks_rolling_windows_without_its_bos(spec, tmp_path):
    """The WikiText task keeps lm-eval's rolling windows, which for a Llama tokenizer score the tokenizer's BOS
    after a second BOS; `raylm ppl` lets that BOS condition instead, so it scores one token less per document. The
    task's requests are scored in-process, by the code its actors run (tests/test_eval_ray.py shows actors give
    the same sums), not on actors started for this."""
    pages = wikitext_docs(DATA)[:2]
    pq.write_table(pa.table({"text": [p.text for p in pages]}), tmp_path / "wiki.parquet")
    result, _ = run(spec, str(tmp_path / "wiki.parquet"), tmp_path / "out")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, ("wikitext",), DATA, limit=2), encoder)
    kind, table = tables["wikitext"]
    task = score_shard(Scorer(model, encoder.max_length), kind, table)
    assert result.stride == result.max_length == 128
    assert result.metrics["docs"] == 2 and result.metrics["tokens"] == task.sums["tokens"] - 2


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gpt2"])
def test_strided_windows_match_the_hf_recipe_reference(model, request):
    """Per-document NLL of overlapping windows (in-process: the same code the actors run) against the HF recipe
    on the tokenizer's own encoding: a Llama tokenizer adds BOS (conditioning, not scored), GPT-2's adds none."""
    path = request.getfixturevalue(model)
    texts = wikitext_lines(8)[3:8] + ["short", " ".join(wikitext_lines(30)[10:14])]
    docs = DocPerplexity(ModelSpec(str(path), dtype="float32", device="cpu"), max_length=48, stride=20)(
        pa.table({"text": texts, "path": ["mem"] * len(texts)}))
    model64 = float64_copy(AutoModelForCausalLM.from_pretrained(path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    for text, nll, count in zip(texts, docs["nll"].to_pylist(), docs["tokens"].to_pylist()):
        expected, scored = reference_strided_nll(model64, tokenizer, text, 48, 20)
        assert scored == count == len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert nll == pytest.approx(expected, rel=1e-6)
    assert max(docs["tokens"].to_pylist()) > 3 * 48  # the long document spans many overlapping windows


@pytest.fixture(scope="module")
def perturbed(tiny_llama, tmp_path_factory) -> ModelSpec:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    torch.manual_seed(3)
    with torch.no_grad():
        for w in model.parameters():
            w.add_(0.05 * torch.randn_like(w))
    path = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(path)
    return ModelSpec(str(path), dtype="float32", device="cpu")


def test_kl_between_different_models_is_positive(spec, perturbed, parquet_run, tmp_path):
    data, ppl, _ = parquet_run
    result, docs = run(spec, data, tmp_path, model_b=perturbed, text_column="body", max_length=64, domain_column="id")
    m = result.metrics
    # Domains by a column of the corpus (each shard's row index: two documents each), a grouping of the sums.
    assert docs["domain"].to_pylist() == [str(i) for i in range(20)] * 2
    domains = m["domains"]
    assert list(domains) == sorted(str(i) for i in range(20)) and {d["docs"] for d in domains.values()} == {2}
    assert math.fsum(d["kl_sum"] for d in domains.values()) == pytest.approx(m["kl_sum"], rel=1e-12)
    assert m["macro"]["kl_mean"] == pytest.approx(sum(d["kl_mean"] for d in domains.values()) / 20)
    assert set(m["macro"]) == {"kl_mean", "argmax_disagree", "token_perplexity_p", "token_perplexity_q"}
    assert results_dict(result)["config"]["prefix_sharing"] == "unpacked (raylm kl scores each window in its own row)"
    assert m["kl_mean"] > 0 and all(kl > 0 for kl in docs["kl"].to_pylist())
    assert 0 < m["argmax_disagree"] < 1
    # P's perplexity comes from the KL scorer's own forward pass, ppl's from the shared-prefix Scorer: the same
    # float32 model through different kernels, so they agree to float32 rounding, not bit for bit.
    assert m["token_perplexity_p"] == pytest.approx(ppl.metrics["token_perplexity"], rel=1e-6)
    assert m["token_perplexity_q"] != pytest.approx(m["token_perplexity_p"], rel=1e-6)


def test_a_corpus_with_nothing_to_score_is_one_line_and_leaves_no_results(spec, tmp_path):
    """Before the errors below: a stream that ends in a worker's error can leave its actors holding the session
    Ray's CPUs (see conftest.ray_restarted_after), and this stream needs them."""
    pq.write_table(pa.table({"text": ["", ""]}), tmp_path / "empty.parquet")
    with pytest.raises(RaylmError, match=r"empty\.parquet: the corpus has no text to score \(2 documents, 0 tokens\)"):
        run(spec, str(tmp_path / "empty.parquet"), tmp_path / "out")
    assert not (tmp_path / "out" / "results.json").exists() and not list((tmp_path / "out").rglob("*.parquet"))


def test_bad_corpus_input_is_refused_with_file_and_field(spec, tmp_path):
    pq.write_table(pa.table({"body": ["fine", None, "also fine"]}), tmp_path / "nulls.parquet")
    with pytest.raises(RaylmError, match=r"nulls\.parquet: field 'text': expected a document's text, got NoneType"):
        run(spec, str(tmp_path / "nulls.parquet"), tmp_path / "out", text_column="body")
    assert not (tmp_path / "out" / "results.json").exists()
    assert not list((tmp_path / "out").rglob("*.parquet"))
    with pytest.raises(RaylmError, match=r"nulls\.parquet: field 'content': no such column \(columns: body"):
        run(spec, str(tmp_path / "nulls.parquet"), tmp_path / "out", text_column="content")
    pq.write_table(pa.table({"body": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(RaylmError, match=r"missing-\*\.parquet: no files match"):
        run(spec, str(tmp_path / "missing-*.parquet"), tmp_path / "out")
    with pytest.raises(RaylmError, match=r"missing\.parquet: cannot read the corpus"):
        run(spec, str(tmp_path / "missing.parquet"), tmp_path / "out")
    with pytest.raises(RaylmError, match="--stride 80 must not exceed the max length 64"):
        run(spec, str(tmp_path / "ints.parquet"), tmp_path / "out", max_length=64, stride=80)
    with pytest.raises(RaylmError, match="exceeds the model's context length 128"):
        run(spec, str(tmp_path / "ints.parquet"), tmp_path / "out", max_length=4096)


def test_ppl_never_replaces_another_commands_results(spec, parquet_run, tmp_path):
    """An eval run's results.json, or one raylm did not write, in the output directory stays, refused before any
    scoring."""
    data, _, _ = parquet_run
    eval_results = {"results": {}, "config": {"versions": {"raylm": "0.1.0"}, "tasks": ["hellaswag"]}}
    for content, expected in ((eval_results, "holds the results of `raylm eval`"),
                              ({"x": 1}, "was not written by raylm")):
        (tmp_path / "results.json").write_text(json.dumps(content))
        with pytest.raises(RaylmError, match=f"results.json' {expected}; use another --output"):
            run(spec, data, tmp_path, text_column="body", max_length=64)
        assert json.loads((tmp_path / "results.json").read_text()) == content


def test_cli_ppl_on_two_actors_matches_one_and_kl_refuses_mismatched_tokenizers(parquet_run, tiny_llama,
                                                                                 tiny_gpt2, tmp_path, capsys):
    """The CLI as users run it (its own local Ray: two actors and a CPU left to reading are more than the session
    Ray holds); 2 actors and 3-document batches give the in-process run's per-document NLL. The kl refusal comes
    before Ray starts, so main() in this process shows it."""
    data, expected, expected_docs = parquet_run
    out = tmp_path / "out"
    proc = run_cli("ppl", "--model", str(tiny_llama), "--data", data, "--text-column", "body", "--max-length", "64",
                   "--actors", "2", "--docs-per-batch", "3", "--output", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = proc.stdout
    results = json.loads((out / "results.json").read_text())
    ppl = results["results"]["ppl"]
    assert set(ppl) == set(expected.metrics) >= {"nll_sum", "tokens", "words", "bytes", "chars", "docs",
                                                 "token_perplexity", "word_perplexity", "byte_perplexity",
                                                 "bits_per_byte", "bits_per_char"}
    assert {k: ppl[k] for k in COUNTS} == {k: expected.metrics[k] for k in COUNTS}
    assert results["config"]["stride"] == results["config"]["max_length"] == 64
    docs = pq.read_table(out / "samples" / "ppl.parquet")
    # Two 1-thread actors with 3-document batches run other float32 kernel shapes than one in-process scorer: a
    # document's NLL (a float64 sum of float32 token log-probs) moves by float32 rounding, 1.2e-8 relative on this
    # machine's oneDNN (1.4e-6 nats of 124). 1e-6 is float32 tolerance for such a sum; a wrong token would be ~1.
    assert docs["nll"].to_pylist() == pytest.approx(expected_docs["nll"].to_pylist(), rel=1e-6)
    assert is_raylm_parquet(out / "samples" / "ppl.parquet")  # what --overwrite checks before deleting it
    assert "token_perplexity" in printed
    capsys.readouterr()
    assert main(["kl", "--model", str(tiny_llama), "--model-b", str(tiny_gpt2), "--data", data,
                 "--output", str(tmp_path / "kl"), "--no-progress"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raylm: error:")]
    assert len(errors) == 1 and "different vocabularies" in errors[0], errors
    assert not (tmp_path / "kl" / "results.json").exists()


def test_cli_ppl_with_weights_that_fail_to_load_in_the_actor_is_one_line(parquet_run, truncated_weights_model,
                                                                        tmp_path):
    """In a process of its own: in the test process, Ray Data's log handler keeps the stderr of the test that
    first streamed, which pytest has closed since, and its failure to log is a traceback on stderr."""
    data, _, _ = parquet_run
    out = tmp_path / "out"
    proc = run_cli("ppl", "--model", str(truncated_weights_model), "--data", data, "--text-column", "body",
                   "--output", str(out), "--no-progress")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raylm: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("raylm: error: corpus scoring failed: SafetensorError: ")
    assert errors[0].endswith(f" (full traceback in {out / 'raylm-error.log'})")
    assert "Traceback" not in proc.stderr and ", in start\n" in (out / "raylm-error.log").read_text()
    assert not (out / "results.json").exists()


def gzip_jsonl_domains(root, domains: dict[str, list[str]]) -> str:
    """Paloma's layout: one `<domain>/val0.jsonl.gz` shard per domain, rows {"text", "id"}; returns their glob."""
    for name, texts in domains.items():
        (root / name).mkdir(parents=True)
        with gzip.open(root / name / "val0.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t, "id": f"{name}-{i}"}) + "\n" for i, t in enumerate(texts))
    return str(root / "*" / "val0.jsonl.gz")


@pytest.fixture(scope="module")
def domain_run(tiny_gpt2, ray_restarted_after, tmp_path_factory):
    """tiny_gpt2 over three domains of very different document lengths (WikiText lines, their first words, whole
    stretches of lines), as gzip'd JSONL, with `--domain-column path` and a checkpoint part per arriving block."""
    lines = wikitext_lines(60)
    domains = {"lines": lines[:14], "heads": [" ".join(t.split()[:3]) for t in lines[14:30]],
               "long": [" ".join(lines[30 + 6 * i:36 + 6 * i]) for i in range(5)]}
    root = tmp_path_factory.mktemp("domains")
    data = gzip_jsonl_domains(root / "data", domains)
    spec = ModelSpec(str(tiny_gpt2), dtype="float32", device="cpu")
    kwargs = {"domain_column": "path", "max_length": 64, "docs_per_batch": 4, "checkpoint_every_s": 0}
    return (spec, data, kwargs, {str(root / "data" / name / "val0.jsonl.gz"): texts for name, texts in domains.items()},
            root / "out", *run(spec, data, root / "out", **kwargs))


def test_a_killed_run_resumes_from_its_checkpoint_to_an_undisturbed_runs_numbers(domain_run, tmp_path):
    """The checkpoint of domain_run cut back to its first part, as a kill leaves it: the same run resumes those
    documents and scores the rest, to the same sums, domains and per-document rows, bit for bit. A changed option
    or data file is refused in one line naming it."""
    spec, data, kwargs, _, out, whole, whole_docs = domain_run
    shutil.copytree(out, tmp_path / "out")
    parts = sorted((tmp_path / "out" / CHECKPOINT_DIR / "shards").iterdir())
    assert len(parts) > 1
    for part in parts[1:]:
        part.unlink()
    (tmp_path / "out" / "results.json").unlink()
    kept = pq.read_table(parts[0]).num_rows
    resumed, docs = run(spec, data, tmp_path / "out", **kwargs)
    assert 0 < resumed.docs_resumed == kept < whole.metrics["docs"] and whole.docs_resumed == 0
    assert resumed.metrics == whole.metrics
    assert docs.equals(whole_docs)
    with pytest.raises(RaylmError, match=r"holds results of a different run \(differs in: limit_docs\); use another "
                                         r"--output, or --overwrite"):
        run(spec, data, tmp_path / "out", **kwargs, limit_docs=10)
    first = sorted(whole_docs["path"].unique().to_pylist())[0]
    stat = os.stat(first)
    try:
        os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        with pytest.raises(RaylmError, match=r"differs in: data\)"):
            run(spec, data, tmp_path / "out", **kwargs)
    finally:
        os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_saved_rows_answer_each_identical_neighbouring_batch_with_its_own_rows(tmp_path):
    """Four neighbouring batches of the same two documents share a key: the driver saves each at its position,
    and a rerun answers a batch of those documents with one batch's rows, never the four's run together; saved
    rows of another count (a batch cut differently) are never used."""
    batch = pa.table({"path": ["a.txt"] * 2, "text": ["same line"] * 2})
    key = batch_key(batch)
    rows = tagged(pa.table({"nll": [1.5, 2.5]}), key, resumed=False)
    manifest = {"command": "ppl", "code": {"raylm": "test"}}
    with CorpusCheckpoint(location(tmp_path), manifest, overwrite=False, every_s=0) as checkpoint:
        for _ in range(4):
            assert checkpoint.add(rows).equals(pa.table({"nll": [1.5, 2.5]}))
        checkpoint.save(final=True)
    reopened = CorpusCheckpoint(location(tmp_path), manifest, overwrite=False, every_s=0)
    assert reopened.saved.positions == {(key, 0), (key, 2), (key, 4), (key, 6)}
    assert reopened.saved.answer(batch, key)["nll"].to_pylist() == [1.5, 2.5]
    assert reopened.saved.answer(pa.concat_tables([batch, batch]), key) is None
    assert reopened.saved.answer(batch, "another key") is None


def test_a_finished_batch_is_saved_on_time_with_no_more_rows_arriving(tmp_path):
    """--checkpoint-every holds while nothing arrives: a batch that finished just after a save is saved once the
    interval has passed, not when (if ever) the next batch comes."""
    batch = pa.table({"path": ["a.txt"] * 2, "text": ["one", "two"]})
    rows = tagged(pa.table({"nll": [1.5, 2.5]}), batch_key(batch), resumed=False)
    manifest = {"command": "ppl", "code": {"raylm": "test"}}
    shards = tmp_path / "on-time" / CHECKPOINT_DIR / "shards"
    with CorpusCheckpoint(location(tmp_path / "on-time"), manifest, overwrite=False, every_s=0.2) as checkpoint:
        checkpoint.last_save = time.monotonic()
        checkpoint.add(rows)
        deadline = time.monotonic() + 60
        while not (shards.is_dir() and any(shards.iterdir())):
            assert time.monotonic() < deadline, "the finished batch was never saved"
            time.sleep(0.05)
    assert pq.read_table(next(shards.iterdir()))["nll"].to_pylist() == [1.5, 2.5]


def test_a_corpus_of_identical_lines_resumes_to_an_undisturbed_runs_numbers(spec, lines, tmp_path):
    """32 identical lines, then 32 others, 4 to a batch: 8 batches of one key. A run cut back to its first part (the
    first of those batches) answers every batch of that key from it (the same documents, scored alone: the same
    rows) and scores the rest, to the undisturbed run's 64 documents, sums and per-document rows; its checkpoint
    then holds every batch once, each at its own position."""
    data = tmp_path / "same.txt"
    data.write_text("the same boilerplate line\n" * 32 + "".join(f"{t}\n" for t in lines[:32]), encoding="utf-8")
    kwargs = {"max_length": 64, "docs_per_batch": 4, "checkpoint_every_s": 0}
    whole, whole_docs = run(spec, str(data), tmp_path / "whole", **kwargs)
    assert whole.metrics["docs"] == 64
    shutil.copytree(tmp_path / "whole", tmp_path / "out")
    shards = tmp_path / "out" / CHECKPOINT_DIR / "shards"
    parts = sorted(shards.iterdir())
    assert len(parts) > 1
    for part in parts[1:]:
        part.unlink()
    (tmp_path / "out" / "results.json").unlink()
    resumed, docs = run(spec, str(data), tmp_path / "out", **kwargs)
    assert resumed.metrics == whole.metrics
    assert docs.equals(whole_docs)
    assert pq.read_table(parts[0]).num_rows == 4 and resumed.docs_resumed == 32
    saved = pa.concat_tables(pq.read_table(part) for part in sorted(shards.iterdir()))
    assert saved.num_rows == 64 and len(set(saved["batch_start"].to_pylist())) == 16


def test_domain_figures_are_lm_evals_rolling_loglikelihood_summed_per_domain(domain_run, tiny_gpt2):
    """Each file of the gzip'd JSONL corpus a domain (`--domain-column path`): its sums are lm-eval's
    loglikelihood_rolling (HFLM, batch 16, the same 64-token windows) summed over the domain's documents, its
    figures follow from them, and `macro` is their unweighted mean over the domains (Paloma's macro average)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    _, _, _, domains, _, result, docs = domain_run
    lm = HFLM(pretrained=str(tiny_gpt2), device="cpu", dtype="float32", batch_size=16, max_length=64)
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    figures = result.metrics["domains"]
    assert list(figures) == sorted(domains) and result.metrics["docs"] == sum(map(len, domains.values()))
    for path, texts in domains.items():
        loglik = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)],
                                          disable_tqdm=True)
        nll, size = -math.fsum(loglik), sum(len(t.encode()) for t in texts)
        m = figures[path]
        assert m["docs"] == len(texts) and m["bytes"] == size
        assert m["tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in texts)
        assert m["nll_sum"] == pytest.approx(nll, rel=1e-6)
        assert m["bits_per_byte"] == pytest.approx(nll / size / math.log(2), rel=1e-6)
        assert docs.filter(pa.compute.equal(docs["path"], path))["bytes"].to_pylist() == [
            len(t.encode()) for t in texts]  # the samples keep each document's domain, in order
    for key in ("bits_per_byte", "token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_char"):
        assert result.metrics["macro"][key] == pytest.approx(sum(m[key] for m in figures.values()) / len(figures))
    assert result.metrics["macro"]["bits_per_byte"] != pytest.approx(result.metrics["bits_per_byte"], rel=1e-3)
    assert math.fsum(m["nll_sum"] for m in figures.values()) == pytest.approx(result.metrics["nll_sum"], rel=1e-12)


def test_cli_ppl_killed_with_its_ray_resumes_from_s3_to_an_undisturbed_runs_numbers(spec, lines, s3, tmp_path,
                                                                                   capsys):
    """`raylm ppl --checkpoint-every 1` over 8 small Parquet files (which Ray Data reads as one block), its output
    on S3 (moto's server), SIGKILLed, driver and its local Ray, once a checkpoint part is stored: one is while
    most of the corpus is still to score, since every scored batch reaches the driver as it is done. The same
    command resumes those documents, says so, and ends with an undisturbed run's numbers, domain by domain."""
    data = write_shards(tmp_path / "data", lines, "parquet", shards=8)
    whole, whole_docs = run(spec, data, tmp_path / "whole", text_column="body", domain_column="path", max_length=64,
                            docs_per_batch=4, checkpoint_every_s=0)
    out = f"{s3}/ppl"
    args = ["ppl", "--model", spec.path, "--dtype", "float32", "--device", "cpu", "--data", data,
            "--text-column", "body", "--domain-column", "path", "--max-length", "64", "--docs-per-batch", "4",
            "--checkpoint-every", "1", "--output", out, "--no-progress"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", SHARD_DELAY_ENV: "0.5"}
    env.pop("RAY_ADDRESS", None)
    parts = location(out) / CHECKPOINT_DIR / "shards"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "raylm", *args], env=env, stdout=log, stderr=log,
                                start_new_session=True)
    deadline = time.monotonic() + 240
    # A part is uploaded under a temporary '.'-name and then put in place (raylm.storage.atomic): a kill while only
    # the upload is there leaves nothing to resume.
    while not any(p.suffix == ".parquet" and not p.name.startswith(".") for p in parts.iterdir()):
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (location(out) / "results.json").exists()
    assert (location(out) / LOCK_FILE).exists()  # the killed run's lease, taken over at once: its holder is dead
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = printed.strip().splitlines()[-1]
    resumed = int(summary.split("; ")[1].split()[0])
    assert 0 < resumed < whole.metrics["docs"] / 2, summary  # not the whole corpus but its last batch, saved at the end
    assert f"; {resumed} of {whole.metrics['docs']} documents resumed from checkpoint; " in summary
    assert all(path in printed for path in whole_docs["path"].unique().to_pylist()) and "macro average" in printed
    assert json.loads((location(out) / "results.json").read_bytes())["results"]["ppl"] == json.loads(
        json.dumps(whole.metrics))
    with (location(out) / "samples" / "ppl.parquet").open_input() as f:
        assert pq.read_table(f).select(whole_docs.column_names).equals(whole_docs)


def test_reads_asking_no_cpu_run_while_actors_hold_every_cpu(ray_session, tmp_path, recwarn):
    """A sweep reads its corpora while its model actors hold every CPU: reads that asked for one would wait for
    ever. read_cpus=0 reaches every read and column step through Ray Data's own parameter, not the deprecated
    ray_remote_args (gone in Ray 2.64)."""
    from ray.util import placement_group, remove_placement_group

    from raylm.corpus.read import read_corpus

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": f"document {i}"}) + "\n" for i in range(3)))
    every_cpu = placement_group([{"CPU": ray_session.cluster_resources()["CPU"]}])
    ray_session.get(every_cpu.ready())
    try:
        rows = read_corpus(str(corpus), text_column="body", read_cpus=0).take_all()
    finally:
        remove_placement_group(every_cpu)
    assert [r["text"] for r in rows] == ["document 0", "document 1", "document 2"]
    assert not [w for w in recwarn if "ray_remote_args" in str(w.message)]
