"""Masked LMs through the whole driver on real Ray actors: results independent of actors, shard and batch sizes;
equal to the float64 reference, on native and lm-eval tasks; resumed from a checkpoint; recorded in results.json;
mixed with causal models in a sweep."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
from conftest import DATA
from reference_masked import reference_pll
from task_requests import build_task_requests
from transformers import AutoModelForMaskedLM, AutoTokenizer

from raylm.cli import main
from raylm.cluster.runtime import start_actors
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec
from raylm.requests.driver import driver_encoder
from raylm.sweep.config import load_sweep
from raylm.sweep.run import run_sweep
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import select
from raylm.tasks.wikitext import load_docs as wikitext_docs

TASKS = ("hellaswag", "winogrande", "wikitext")
LIMIT = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The shared HellaSwag and WinoGrande rows, and WikiText articles cut to their first lines: each still spans
    several 128-token windows, without scoring thousands of masked copies per article."""
    root = tmp_path_factory.mktemp("mlm-data")
    for task in ("hellaswag", "winogrande"):
        (root / task).symlink_to(DATA / task)
    lines = (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(" = ") and not line.startswith(" = = ")]
    (root / "wikitext-2").mkdir()
    (root / "wikitext-2" / "test.txt").write_text("".join(line for s in starts[:LIMIT] for line in lines[s:s + 6]),
                                                 encoding="utf-8")
    return root


def config(spec: ModelSpec, data: Path, **kwargs) -> EvalConfig:
    return EvalConfig(spec, TASKS, data, limit=LIMIT, progress=False, **kwargs)


@pytest.fixture(scope="module")
def spec(tiny_bert) -> ModelSpec:
    return ModelSpec(str(tiny_bert), dtype="float32", device="cpu", pll="word-l2r")


@pytest.fixture(scope="module")
def runs(ray_session, spec, data):
    """The same evaluation on 1 actor with one shard per task and auto batches, and on 2 actors with 5-request
    shards and 7 masked copies per batch."""
    out = {}
    for n_actors, shard_requests, batch_size in ((1, 512, None), (2, 5, 7)):
        actors = start_actors(spec, n_actors, batch_size, num_cpus=1)
        out[n_actors] = (evaluate(config(spec, data, shard_requests=shard_requests, batch_size=batch_size), actors),
                         ray.get([a.ready.remote() for a in actors]))
        for actor in actors:
            ray.kill(actor)
    return out


def test_results_do_not_depend_on_actors_shards_or_batches(runs):
    (one, _), (two, pids) = runs[1], runs[2]
    assert len(set(pids)) == 2 and os.getpid() not in pids and two.extra["shards"] > one.extra["shards"]
    for name in TASKS:
        a, b = one.tasks[name], two.tasks[name]
        assert a.scored["doc_id"].to_pylist() == b.scored["doc_id"].to_pylist()
        assert a.scored["req_idx"].to_pylist() == b.scored["req_idx"].to_pylist()
        assert a.scored["continuation_tokens"].to_pylist() == b.scored["continuation_tokens"].to_pylist()
        assert a.scored["loglikelihood"].to_pylist() == pytest.approx(b.scored["loglikelihood"].to_pylist(), rel=1e-5)
        if a.kind == "multiple_choice":
            assert a.sums == b.sums
        else:
            assert {k: v for k, v in a.sums.items() if k != "nll"} == {k: v for k, v in b.sums.items() if k != "nll"}
            assert a.sums["nll"] == pytest.approx(b.sums["nll"], rel=1e-8)
    assert one.extra["scorer"] == "mlm" and one.extra["pll"] == "word-l2r"


def test_every_request_scored_as_the_float64_reference(runs, spec, data):
    """The driver's tables, scored by actors, against the one-copy-at-a-time reference (the WikiText task's
    windows each token once: its token count is every token of every article)."""
    result, _ = runs[2]
    tables, _ = build_task_requests(config(spec, data), driver_encoder(spec))
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    model64 = AutoModelForMaskedLM.from_pretrained(spec.path).double().eval()
    for name in ("hellaswag", "winogrande"):
        table, scored = tables[name][1], result.tasks[name].scored
        for i in range(table.num_rows):
            row = [table[c][i].as_py() for c in ("context", "continuation", "following", "word_ids")]
            expected, greedy = reference_pll(model64, *row, tokenizer.mask_token_id, "word-l2r")
            assert scored["loglikelihood"][i].as_py() == pytest.approx(expected, rel=1e-5)
            assert scored["is_greedy"][i].as_py() == greedy
    articles = [d.text for d in wikitext_docs(data)]
    assert result.tasks["wikitext"].sums["tokens"] == sum(len(tokenizer(a, add_special_tokens=False)["input_ids"])
                                                          for a in articles)


def test_rerun_resumes_from_the_checkpoint_and_a_changed_variant_is_refused(runs, spec, data, tmp_path):
    reference, _ = runs[1]
    actors = start_actors(spec, 1, None, num_cpus=1)
    try:
        seen = []

        def die_after_two(shard, result):
            seen.append(shard.index)
            if len(seen) == 2:
                raise KeyboardInterrupt("driver killed")

        cfg = config(spec, data, shard_requests=5, output=tmp_path)
        with pytest.raises(KeyboardInterrupt):
            evaluate(cfg, actors, on_shard=die_after_two)
        resumed = evaluate(cfg, actors)
        assert resumed.extra["shards_resumed"] == 2 and resumed.extra["shards"] > 2
        for name in TASKS:
            assert resumed.tasks[name].metrics == pytest.approx(reference.tasks[name].metrics, rel=1e-8)
        manifest = json.loads((tmp_path / "checkpoint" / "manifest.json").read_text())
        assert manifest["model"]["scorer"] == "mlm" and manifest["model"]["pll"] == "word-l2r"
        with pytest.raises(RaylmError, match=r"differs in: model"):
            evaluate(config(ModelSpec(spec.path, "float32", "cpu"), data, shard_requests=5, output=tmp_path), actors)
    finally:
        for actor in actors:
            ray.kill(actor)


def test_command_line_records_scorer_and_variant(ray_session, tiny_roberta, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_roberta), "--tasks", "winogrande", "--data-dir", str(data), "--limit",
                 "3", "--output", str(out), "--no-progress", "--dtype", "float32", "--pll", "original"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["scorer"] == "mlm" and results["config"]["pll"] == "original"
    assert results["config"]["model_args"]["scorer"] == "auto"
    assert 0 <= results["results"]["winogrande"]["acc,none"] <= 1
    assert "winogrande" in capsys.readouterr().out


def test_a_sweep_mixes_causal_and_masked_models(ray_session, tiny_llama, tiny_bert, data, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""\
models:
  - path: {tiny_llama}
    name: llama
  - path: {tiny_bert}
    pll: word-l2r
tasks: [winogrande]
data_dir: {data}
device: cpu
settings:
  limit: [3]
""")
    sweep = load_sweep(path)
    assert [m.name for m in sweep.models] == ["llama", f"{tiny_bert.name}-word-l2r"]
    run_sweep(sweep, tmp_path / "out")
    configs = {m.name: json.loads((tmp_path / "out" / m.name / sweep.points[0].name / "results.json").read_text())
               ["config"] for m in sweep.models}
    assert configs["llama"]["scorer"] == "causal" and configs["llama"]["pll"] is None
    assert configs[f"{tiny_bert.name}-word-l2r"]["scorer"] == "mlm"
    assert configs[f"{tiny_bert.name}-word-l2r"]["pll"] == "word-l2r"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert all(f"| {m.name} |" in summary for m in sweep.models)


def test_lm_eval_tasks_are_scored_as_the_float64_reference(ray_session, spec, local_tasks, tmp_path):
    """A masked LM on lm-eval's tasks: ARC-Easy's (context, continuation) requests and a rolling task (ARC's
    questions as texts), as lm-eval builds them, scored by masked actors; every request equals the one-copy
    float64 reference of its MaskedEncoder rows (each rolling text the sum over its windows), and lm-eval computes
    the metrics from those scores."""
    (tmp_path / "arc_question_rolling_local.yaml").write_text(
        f"task: arc_question_rolling_local\ninclude: {local_tasks / 'arc_easy_local.yaml'}\ntag: null\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{question}}'\ndoc_to_choice: null\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    for path in local_tasks.glob("arc_easy_local.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    tasks = ("arc_easy_local", "arc_question_rolling_local")
    cfg = EvalConfig(spec, tasks, limit=3, progress=False, include_path=tmp_path, bootstrap_iters=0)
    actors = start_actors(spec, 2, None, num_cpus=1)
    try:
        result = evaluate(cfg, actors)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert result.extra["scorer"] == "mlm"
    encoder = driver_encoder(spec)
    built = load_and_build(select(tasks, tmp_path), cfg.seeds, None, 3)
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    model64 = AutoModelForMaskedLM.from_pretrained(spec.path).double().eval()
    for name in tasks:
        scored = result.tasks[name].scored
        got: dict[tuple[int, int], float] = {}
        for doc_id, idx, ll in zip(scored["doc_id"].to_pylist(), scored["req_idx"].to_pylist(),
                                   scored["loglikelihood"].to_pylist()):
            got[doc_id, idx] = got.get((doc_id, idx), 0.0) + ll
        requests = built.requests(name)
        assert len(got) == len(requests) > 0
        for request in requests:
            rows = encoder.document_windows(request.arguments)[0] if name != "arc_easy_local" \
                else encoder.encode_pairs([request.arguments])
            expected = sum(reference_pll(model64, r.context, r.continuation, r.following, r.word_ids,
                                         tokenizer.mask_token_id, "word-l2r")[0] for r in rows)
            assert got[request.doc_id, request.idx] == pytest.approx(expected, rel=1e-5)
    assert 0 <= result.lmeval["results"]["arc_easy_local"]["acc,none"] <= 1
    assert result.lmeval["results"]["arc_question_rolling_local"]["word_perplexity,none"] > 1
