"""`raylm compare`: the paired statistics against direct computations (numpy/scipy on random data, a hand-worked
example, the cluster-robust formula as a double sum, the pooled bits per byte's delta method as a float64 loop),
and end to end on two runs written by raylm's own writers (native and lm-eval tasks, an lm-eval group), on
lm-eval's own output layout and on two `raylm ppl` outputs (tiny models scored in-process, no Ray), with the
refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import scipy.stats
from conftest import DATA, STORIES
from ppl_outputs import write_ppl_output

from raylm.cli import main
from raylm.compare.comparison import compare_runs
from raylm.compare.find import find_runs
from raylm.compare.output import COMPARISON_CSV, COMPARISON_JSON
from raylm.compare.statistics import (
    Z95,
    clustered_stderr,
    macro_difference,
    paired_difference,
    pooled_bits_difference,
)
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec
from raylm.requests.shards import LMEVAL_KIND
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.lmeval import results
from raylm.results.report import write_results, write_samples
from raylm.results.sample_logs import sample_log, sample_log_name
from raylm.scoring.predictions import choice_predictions
from raylm.storage.location import location

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3
MACRO = "macro_local"  # an lm-eval group over boolq_local (3 documents) and piqa_local (6), weighed equally
LMEVAL_TASKS = ("mmlu_local", "arc_easy_local", MACRO)


def compared(*places) -> dict:
    """compare's result for the runs at these places, as the command reads them."""
    return compare_runs([run for where in places for run in find_runs(where)])
SEEDS = (0, 1234, 1234, 1234)
LIMIT = 6
NATIVE = ("hellaswag", "winogrande", "wikitext")
# lm-eval's own --log_samples output for its hellaswag, winogrande and wikitext on the first 3 rows of tests/data
NATIVE_GOLDEN = Path(__file__).parent / "golden" / "lmeval-0.4.13_native_samples"


def test_paired_difference_equals_numpy_and_scipy_on_random_data():
    rng = np.random.default_rng(3)
    a = rng.random(200) < 0.4
    b = np.where(rng.random(200) < 0.8, a, rng.random(200) < 0.6)  # b agrees with a on most documents
    d = b.astype(np.float64) - a
    out = paired_difference(a, b)
    assert out.n == 200 and out.a == a.mean() and out.b == b.mean() and out.diff == pytest.approx(d.mean(), abs=1e-15)
    assert out.diff_stderr == pytest.approx(scipy.stats.sem(d), rel=1e-12)
    assert out.unpaired_stderr == pytest.approx(math.hypot(scipy.stats.sem(a), scipy.stats.sem(b)), rel=1e-12)
    t = scipy.stats.ttest_rel(b.astype(float), a.astype(float))
    assert out.diff / out.diff_stderr == pytest.approx(t.statistic, rel=1e-12)  # the paired test's statistic
    assert out.p_value == pytest.approx(2 * scipy.stats.norm.sf(abs(t.statistic)), rel=1e-12)
    assert (out.ci95_low, out.ci95_high) == pytest.approx(
        scipy.stats.norm.interval(0.95, loc=d.mean(), scale=scipy.stats.sem(d)), rel=1e-12)
    assert out.diff_stderr < out.unpaired_stderr / 2


def test_a_hand_worked_pair_and_group():
    # d = (0, 1, 0, -1): mean 0, sd sqrt(2/3), stderr sqrt(2/3) / 2
    out = paired_difference(np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0]))
    assert (out.diff, out.diff_stderr, out.p_value) == (0.0, pytest.approx(math.sqrt(2 / 3) / 2), 1.0)
    assert out.ci95_high == pytest.approx(Z95 * math.sqrt(2 / 3) / 2)
    # d = (1, 1, 0, 0) in clusters (x, x, y, y): deviations +-0.5, cluster sums 1 and -1: sqrt(2) / 4
    group = paired_difference(np.zeros(4), np.array([1.0, 1.0, 0.0, 0.0]), np.array(["x", "x", "y", "y"]))
    assert group.diff == 0.5 and group.diff_stderr_clustered == pytest.approx(math.sqrt(2) / 4)
    assert group.clusters == 2 and group.diff_stderr == pytest.approx(math.sqrt(1 / 3) / 2)
    assert group.ci95_low == pytest.approx(0.5 - Z95 * math.sqrt(2) / 4)  # the interval uses the clustered se
    # one cluster (a group of one subtask, as MMLU's categories here): no clustered se, the subtask's own interval
    alone = paired_difference(np.zeros(4), np.array([1.0, 1.0, 0.0, 0.0]), np.array(["x"] * 4))
    plain = paired_difference(np.zeros(4), np.array([1.0, 1.0, 0.0, 0.0]))
    assert alone.as_dict()["diff_stderr_clustered"] is None and alone.clusters == 1
    assert (alone.ci95_low, alone.p_value) == (plain.ci95_low, plain.p_value)
    # no document moved by a different amount: a zero standard error, and p 0 (something moved) or 1 (nothing)
    assert paired_difference(np.zeros(3), np.ones(3)).p_value == 0.0
    assert paired_difference(np.ones(1), np.ones(1)).as_dict()["diff_stderr"] is None  # one document: no stderr


def test_clustered_stderr_is_the_cluster_robust_double_sum():
    rng = np.random.default_rng(5)
    d = rng.normal(size=90) + np.repeat(rng.normal(size=9), 10)  # correlated within clusters
    clusters = np.repeat(np.arange(9), 10)
    rng.shuffle(order := np.arange(90))
    d, clusters = d[order], clusters[order]
    centred = d - d.mean()
    double_sum = sum(centred[i] * centred[j] for i in range(90) for j in range(90) if clusters[i] == clusters[j])
    assert clustered_stderr(d, clusters) == pytest.approx(math.sqrt(double_sum) / 90, rel=1e-12)
    # every document its own cluster: the plain (n, not n - 1) standard error of the mean
    assert clustered_stderr(d, np.arange(90)) == pytest.approx(np.std(d) / math.sqrt(90), rel=1e-12)


# End to end: runs written by raylm's writers from scores, without a model or Ray.

def random_scores(built, seed: int) -> dict:
    """(loglikelihood, is_greedy) per request, drawn at random: what a model's scores look like to the writers."""
    rng = np.random.default_rng(seed)
    return {(task, r.doc_id, r.idx): (float(-rng.gamma(2.0, 10.0)), bool(rng.random() < 0.2))
            for task in built.tasks["tasks"] for r in built.requests(task)}


def lmeval_task_result(built, name: str, scores: dict) -> TaskResult:
    """An lm-eval task's TaskResult as evaluate() hands it to the writers: one scored row per request."""
    requests = built.requests(name)
    docs = len({r.doc_id for r in requests})
    scored = pa.table({"doc_id": [r.doc_id for r in requests], "req_idx": [r.idx for r in requests],
                       "window": [0] * len(requests), "context_tokens": [1] * len(requests),
                       "continuation_tokens": [1] * len(requests),
                       "loglikelihood": [scores[(name, r.doc_id, r.idx)][0] for r in requests]})
    return TaskResult(name, LMEVAL_KIND, {}, {"docs": docs}, docs, scored)


def _native(seed: int) -> tuple[TaskResult, TaskResult]:
    """HellaSwag (4 documents of 4 choices) and WikiText (3 documents of 2 windows, the last with no words, as a
    page of numbers would have), scored at random."""
    rng = np.random.default_rng(seed)
    choice = pa.table({"doc_id": np.repeat(np.arange(4), 4), "req_idx": np.tile(np.arange(4), 4),
                       "gold": np.repeat([0, 1, 2, 3], 4), "norm_len": rng.integers(5, 30, 16),
                       "loglikelihood": -rng.gamma(2.0, 10.0, 16), "is_greedy": np.zeros(16, bool)})
    rolling = pa.table({"doc_id": np.repeat(np.arange(3), 2), "req_idx": np.tile([0, 1], 3), "gold": [-1] * 6,
                        "norm_len": [0] * 6, "words": [40, 0, 25, 0, 0, 0], "bytes": [200, 0, 130, 0, 310, 0],
                        "loglikelihood": -rng.gamma(50.0, 10.0, 6), "is_greedy": np.zeros(6, bool)})
    p = choice_predictions(choice)
    acc, acc_norm = float(np.mean(p.pred == p.gold)), float(np.mean(p.pred_norm == p.gold))
    sums = {"docs": 4, "correct": 4 * acc, "correct_norm": 4 * acc_norm}
    hellaswag = TaskResult("hellaswag", "multiple_choice", {"acc,none": acc, "acc_stderr,none": 0.25,
                                                            "acc_norm,none": acc_norm, "acc_norm_stderr,none": 0.25},
                           sums, 4, choice)
    wikitext = TaskResult("wikitext", "rolling", {f"{m},none": 1.0 for m in ("word_perplexity", "byte_perplexity",
                                                                             "bits_per_byte")},
                          {"docs": 3, "nll": 1.0, "tokens": 9, "words": 65, "bytes": 640}, 3, rolling)
    hellaswag.doc_hashes = {d: f"hellaswag document {d}" for d in range(4)}
    wikitext.doc_hashes = {d: f"wikitext page {d}" for d in range(3)}
    hellaswag.row_hashes = {d: f"hellaswag row {d}" for d in range(4)}
    return hellaswag, wikitext


@pytest.fixture(scope="module")
def built(local_tasks, tmp_path_factory):
    """The lm-eval tasks on LIMIT documents each (--samples), boolq_local on 3: MACRO's subtasks differ in size,
    so its reported macro mean is not the mean over its documents."""
    from raylm.tasks.lmeval.build import load_and_build
    from raylm.tasks.lmeval.names import select

    tasks = tmp_path_factory.mktemp("compare-tasks") / "tasks"
    shutil.copytree(local_tasks, tasks)
    (tasks / f"{MACRO}.yaml").write_text(
        f"group: {MACRO}\ntask: [boolq_local, piqa_local]\n"
        "aggregate_metric_list:\n  - {metric: acc, weight_by_size: false}\nmetadata: {version: 1.0}\n")
    selection = select(list(LMEVAL_TASKS), tasks)
    samples = {leaf: list(range(3 if leaf == "boolq_local" else LIMIT)) for leaf in selection.leaves}
    return load_and_build(selection, SEEDS, None, None, samples)


def _write_run(out, built, seed: int) -> dict:
    """A `raylm eval --log-samples` output for scores drawn with `seed`, through raylm's writers; lm-eval's
    results dict (with its logged samples) returned."""
    scores = random_scores(built, seed)
    theirs = results(built, scores, bootstrap_iters=0)
    tasks = {t.name: t for t in _native(seed)}
    tasks.update({name: lmeval_task_result(built, name, scores) for name in built.tasks["tasks"]})
    cfg = EvalConfig(ModelSpec(str(STORIES)), ("hellaswag", "wikitext", *LMEVAL_TASKS), bootstrap_iters=0,
                     samples=built.samples)
    result = EvalResult(cfg, tasks, 1.0, {}, lmeval=theirs)
    write_samples(out, result)
    write_results(out, result)
    return theirs


@pytest.fixture(scope="module")
def runs(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    a, b = root / "a", root / "b"
    return a, b, _write_run(a, built, 1), _write_run(b, built, 2)


def _accs(samples: list[dict]) -> np.ndarray:
    return np.array([s["acc"] for s in sorted(samples, key=lambda s: s["doc_id"])], np.float64)


def test_compare_equals_a_direct_computation_on_the_runs_per_document_scores(runs):
    a, b, theirs_a, theirs_b = runs
    pair = compared(a, b)["comparisons"][0]
    arc = pair["tasks"]["arc_easy_local"]
    xa, xb = _accs(theirs_a["samples"]["arc_easy_local"]), _accs(theirs_b["samples"]["arc_easy_local"])
    assert (arc["metric"], arc["n"], arc["a"], arc["b"]) == ("acc", LIMIT, xa.mean(), xb.mean())
    assert arc["a"] == theirs_a["results"]["arc_easy_local"]["acc,none"]
    assert arc["diff_stderr"] == pytest.approx(np.std(xb - xa, ddof=1) / math.sqrt(LIMIT), rel=1e-12)
    assert set(arc["metrics"]) == {"acc", "acc_norm"} and "diff_stderr_clustered" not in arc

    # mmlu_local: its subjects' documents, clustered by subject
    subjects = sorted(t for t in theirs_a["samples"] if t.startswith("mmlu_"))
    da = np.concatenate([_accs(theirs_a["samples"][t]) for t in subjects])
    db = np.concatenate([_accs(theirs_b["samples"][t]) for t in subjects])
    clusters = np.repeat(np.arange(len(subjects)), LIMIT)
    d = db - da
    centred = d - d.mean()
    expected = math.sqrt(sum(centred[clusters == c].sum() ** 2 for c in range(len(subjects)))) / len(d)
    mmlu = pair["tasks"]["mmlu_local"]
    assert (mmlu["n"], mmlu["clusters"]) == (len(d), len(subjects))
    assert mmlu["diff"] == pytest.approx(d.mean(), abs=1e-15)
    assert mmlu["a"] == pytest.approx(theirs_a["groups"]["mmlu_local"]["acc,none"], rel=1e-12)  # size-weighted
    assert mmlu["diff_stderr_clustered"] == pytest.approx(expected, rel=1e-12)
    assert mmlu["p_value"] == pytest.approx(math.erfc(abs(d.mean() / expected) / math.sqrt(2)), rel=1e-9)
    assert "mmlu_local_stem" in pair["tasks"]


def test_a_group_weighing_its_subtasks_equally_pairs_the_macro_mean_each_run_reports(runs):
    """MACRO (weight_by_size: false over 3 and 6 documents): compare's a and b are the runs' own results.json
    values, its difference the mean of the two subtasks' differences, its clustered standard error the
    cluster-robust one of that weighted mean (each document weighs 1 / (2 n_subtask))."""
    a, b, theirs_a, theirs_b = runs
    macro = compared(a, b)["comparisons"][0]["tasks"][MACRO]
    reported = [json.loads((run / "results.json").read_text())["groups"][MACRO]["acc,none"] for run in (a, b)]
    assert (macro["a"], macro["b"]) == (pytest.approx(reported[0], rel=1e-12), pytest.approx(reported[1], rel=1e-12))
    parts = [(_accs(theirs_a["samples"][t]), _accs(theirs_b["samples"][t])) for t in ("boolq_local", "piqa_local")]
    assert [len(x) for x, _ in parts] == [3, LIMIT]
    pooled = np.concatenate([x for x, _ in parts]).mean()
    assert not math.isclose(pooled, reported[0])  # the mean over its documents is another number
    d = np.concatenate([y - x for x, y in parts])
    weight = np.concatenate([np.full(len(x), 1 / (2 * len(x))) for x, _ in parts])
    diff = float(np.mean([(y - x).mean() for x, y in parts]))
    cluster_sums = [np.sum(w * (dk - diff)) for w, dk in zip(np.split(weight, [3]), np.split(d, [3]))]
    assert (macro["n"], macro["clusters"]) == (3 + LIMIT, 2)
    assert macro["diff"] == pytest.approx(diff, rel=1e-12, abs=1e-15)
    assert macro["diff_stderr_clustered"] == pytest.approx(math.sqrt(sum(c ** 2 for c in cluster_sums)), rel=1e-12)


def test_a_metric_whose_reported_number_is_not_its_documents_mean_is_refused_in_one_line(runs, tmp_path, capsys):
    """A number aggregated otherwise than by a mean (tinyBenchmarks' IRT estimates, a median): no paired
    difference describes it, and compare says so instead of pairing the documents' mean."""
    a, b, _, _ = runs
    irt = tmp_path / "irt"
    shutil.copytree(b, irt)
    data = json.loads((irt / "results.json").read_text())
    data["results"]["arc_easy_local"]["acc,none"] = 0.123
    data["results"]["piqa_local"]["acc,none"] = 0.123  # MACRO's subtask: the group's acc is refused with it
    (irt / "results.json").write_text(json.dumps(data))
    pair = compared(a, irt)["comparisons"][0]
    assert MACRO not in pair["tasks"] and pair["refused"][MACRO] == {"acc": "its subtask piqa_local's is refused"}
    assert "acc" not in pair["tasks"]["arc_easy_local"]["metrics"] and "acc_norm" in pair["tasks"]["arc_easy_local"]["metrics"]
    assert pair["refused"]["arc_easy_local"]["acc"].startswith(f"{irt} reports 0.123, its documents' mean is ")
    assert main(["compare", str(a), str(irt)]) == 0
    refused = [line for line in capsys.readouterr().out.splitlines() if line.startswith("refused:")]
    assert refused[0] == f"refused: arc_easy_local: acc: {pair['refused']['arc_easy_local']['acc']}"
    assert len(refused) == 3 and refused[2] == f"refused: {MACRO}: acc: its subtask piqa_local's is refused"


def test_native_tasks_pair_accuracy_and_loglikelihood_per_word_and_byte(runs):
    a, b, _, _ = runs
    pair = compared(a, b)["comparisons"][0]
    (ha, wa), (hb, wb) = _native(1), _native(2)

    def acc(task):
        ll = task.scored["loglikelihood"].to_numpy().reshape(4, 4)
        return (ll.argmax(axis=1) == np.arange(4)).astype(float)

    assert pair["tasks"]["hellaswag"]["metrics"]["acc"]["diff"] == pytest.approx((acc(hb) - acc(ha)).mean())
    assert set(pair["tasks"]["hellaswag"]["metrics"]) == {"acc", "acc_norm"}

    def per_word(task):  # the page without words has no loglikelihood per word: left out of the pairs
        return task.scored["loglikelihood"].to_numpy().reshape(3, 2).sum(axis=1)[:2] / np.array([40, 25])

    words = pair["tasks"]["wikitext"]["metrics"]["loglikelihood_per_word"]
    assert (words["n"], pair["tasks"]["wikitext"]["metrics"]["loglikelihood_per_byte"]["n"]) == (2, 3)
    assert words["diff"] == pytest.approx((per_word(wb) - per_word(wa)).mean(), rel=1e-12)
    assert words["diff_stderr"] == pytest.approx(scipy.stats.sem(per_word(wb) - per_word(wa)), rel=1e-12)
    assert pair["tasks"]["wikitext"]["not_paired"] == ["bits_per_byte", "byte_perplexity", "word_perplexity"]


def test_lm_evals_own_output_directory_compares_like_a_raylm_run(runs, tmp_path):
    """B laid out as lm-eval's --output_path writes it: <model>/results_<date>.json and samples_<task>_<date>.jsonl
    (an older run beside it, which compare must not read)."""
    a, b, _, theirs_b = runs
    model_dir = tmp_path / "lmeval-out" / "stories260K"
    model_dir.mkdir(parents=True)
    lmeval_results = (b / "results.json").read_text()  # lm-eval's shape (raylm's extras are keys it ignores)
    for date, content in (("2026-01-01T00-00-00.000001", "{}"), ("2026-12-03T10-00-00.000001", None)):
        (model_dir / f"results_{date}.json").write_text(content or lmeval_results)
        for task, samples in theirs_b["samples"].items():
            (model_dir / sample_log_name(task, date)).write_bytes(b"" if content else sample_log(task, samples))
    ours = compared(a, b)["comparisons"][0]["tasks"]
    theirs = compared(a, tmp_path / "lmeval-out")["comparisons"][0]["tasks"]
    lmeval_names = [t for t in ours if t not in ("hellaswag", "wikitext")]
    assert lmeval_names and {t: ours[t] for t in lmeval_names} == {t: theirs[t] for t in lmeval_names}


def _lmeval_native_output(where: Path) -> Path:
    """lm-eval's --output_path for its own hellaswag, winogrande and wikitext on the tests' first 3 rows: the
    samples_<task>_<date>.jsonl lm-eval wrote (tests/golden/make_native_samples.py), and a results_<date>.json
    reporting each per-document metric as lm-eval aggregates it, its documents' mean."""
    date = "2026-12-03T10-00-00.000001"
    model_dir = where / "stories260K"
    model_dir.mkdir(parents=True)
    results: dict = {"results": {}, "configs": {}, "n-shot": {}, "config": {"model": "hf"}}
    for task in NATIVE:
        log = (NATIVE_GOLDEN / f"samples_{task}.jsonl").read_text()
        (model_dir / sample_log_name(task, date)).write_text(log)
        samples = [json.loads(line) for line in log.splitlines()]
        results["results"][task] = {f"{m},none": float(np.mean([s[m] for s in samples]))
                                    for m in samples[0]["metrics"] if m in ("acc", "acc_norm")}
        results["configs"][task], results["n-shot"][task] = {"task": task}, 0
    (model_dir / f"results_{date}.json").write_text(json.dumps(results))
    return where


def test_a_native_run_pairs_every_document_with_lm_evals_own_run_of_its_task(ray_session, tmp_path):
    """raylm's native HellaSwag, WinoGrande and WikiText against lm-eval's own tasks on the same rows and model,
    the first comparison a user makes: every document pairs (each run's doc_hash is lm-eval's hash of the doc as
    its task processes it: HellaSwag's with the query, choices and gold its process_docs adds), and the same
    model on the same prompts differs by nothing."""
    cfg = EvalConfig(ModelSpec(str(STORIES), dtype="float32"), NATIVE, DATA, limit=3, log_samples=True,
                     bootstrap_iters=0, progress=False)
    result = evaluate(cfg)
    ours = tmp_path / "raylm"
    write_samples(ours, result)
    write_results(ours, result)
    pair = compared(ours, _lmeval_native_output(tmp_path / "lm-eval"))["comparisons"][0]
    assert (pair["refused"], pair["only_in_a"], pair["only_in_b"]) == ({}, [], [])
    assert {task: {m: d["n"] for m, d in entry["metrics"].items()} for task, entry in pair["tasks"].items()} == {
        "hellaswag": {"acc": 3, "acc_norm": 3}, "winogrande": {"acc": 3},
        "wikitext": {"loglikelihood_per_word": 3, "loglikelihood_per_byte": 3}}
    for task, entry in pair["tasks"].items():
        for metric, numbers in entry["metrics"].items():
            assert numbers["diff"] == pytest.approx(0, abs=1e-6), (task, metric)


def test_runs_on_other_documents_or_few_shot_seeds_are_refused_in_one_line(runs, built, tmp_path):
    a, b, _, _ = runs
    fewer = tmp_path / "fewer"
    shutil.copytree(b, fewer)
    docs = fewer / "samples" / "hellaswag_docs.parquet"
    pq.write_table(pq.read_table(docs).slice(0, 3), docs)
    with pytest.raises(RaylmError, match=r"^hellaswag: .* are not on the same documents \(4 and 3, 3 in common"):
        compared(a, fewer)
    other_data = tmp_path / "other-data"  # the same doc_ids, another document under one (another --data-dir)
    shutil.copytree(b, other_data)
    pages = other_data / "samples" / "wikitext.parquet"
    table = pq.read_table(pages)
    hashes = table["doc_hash"].to_pylist()
    pq.write_table(table.set_column(table.column_names.index("doc_hash"), "doc_hash",
                                    pa.array([h.replace("page 2", "page X") for h in hashes])), pages)
    with pytest.raises(RaylmError, match=r"^wikitext: .* hold other documents under doc_id 2 \(doc_hash differs"):
        compared(a, other_data)
    other_rows = tmp_path / "other-rows"  # raylm's own row_hash differs (runs without lm-eval's doc_hash)
    shutil.copytree(b, other_rows)
    docs = other_rows / "samples" / "hellaswag_docs.parquet"
    table = pq.read_table(docs).drop_columns(["doc_hash"])
    pq.write_table(table.set_column(table.column_names.index("row_hash"), "row_hash",
                                    pa.array(["hellaswag row 0", "another row", "x", "y"])), docs)
    with pytest.raises(RaylmError, match=r"^hellaswag: .* under doc_id 1 \(row_hash differs: other data\)"):
        compared(a, other_rows)
    seeded = tmp_path / "seeded"
    shutil.copytree(b, seeded)
    results_path = seeded / "results.json"
    data = json.loads(results_path.read_text())
    data["n-shot"]["arc_easy_local"] = data["n-shot"].get("arc_easy_local") or 3
    data["config"]["fewshot_seed"] = 7
    results_path.write_text(json.dumps(data))
    first = json.loads((a / "results.json").read_text())
    first["n-shot"]["arc_easy_local"] = 3
    shifted = tmp_path / "a3"
    shutil.copytree(a, shifted)
    (shifted / "results.json").write_text(json.dumps(first))
    with pytest.raises(RaylmError, match=r"^arc_easy_local: .* few-shot examples with other seeds \(1234 and 7\)"):
        compared(shifted, seeded)
    with pytest.raises(RaylmError, match="compare needs two runs or more"):
        compared(a)


def test_the_command_prints_the_table_and_writes_comparison_json_and_csv(runs, tmp_path, capsys):
    a, b, _, _ = runs
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "mmlu_local" in printed and "95% interval" in printed and "wikitext: word_perplexity" in printed
    written = json.loads((tmp_path / "cmp" / COMPARISON_JSON).read_text())
    pair = written["comparisons"][0]
    assert (written["baseline"], pair["a"], pair["b"]) == (str(a), str(a), str(b))
    assert {"n", "a", "b", "diff", "diff_stderr", "p_value"} <= set(pair["tasks"]["arc_easy_local"])
    assert "diff_stderr_clustered" in pair["tasks"]["mmlu_local"]
    lines = (tmp_path / "cmp" / COMPARISON_CSV).read_text().splitlines()
    assert lines[0].startswith("run_a,run_b,task,metric,n,a,b,diff,diff_stderr")
    assert len(lines) - 1 == sum(len(e["metrics"]) for e in pair["tasks"].values())
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2


def test_a_sweep_compares_every_point_with_its_first_in_summary_order(runs, tmp_path):
    a, b, _, _ = runs
    sweep = tmp_path / "sweep"
    for point, run in (("bf16", b), ("fp32", a), ("again", a)):
        shutil.copytree(run, sweep / "stories" / point)
    (sweep / "summary.csv").write_text("model,point\nstories,fp32\nstories,bf16\nstories,again\n")
    out = compared(sweep)
    assert out["baseline"] == f"{sweep}/stories/fp32"
    assert [pair["b"] for pair in out["comparisons"]] == [f"{sweep}/stories/bf16", f"{sweep}/stories/again"]
    assert out["comparisons"][0]["tasks"] == compared(a, b)["comparisons"][0]["tasks"]
    same = out["comparisons"][1]["tasks"]["mmlu_local"]
    assert (same["diff"], same["diff_stderr_clustered"], same["p_value"]) == (0.0, 0.0, 1.0)


def test_runs_and_outputs_on_object_storage_are_read_and_written_by_uri(runs, s3, capsys):
    """Runs and outputs named by URI (S3 on moto's server here): compare reads a run and a run's results.json
    from there as from a directory, and writes comparison.json and the report page there."""
    a, b, _, _ = runs
    remote = location(f"{s3}/runs/b")
    pafs.copy_files(str(b), remote.path, destination_filesystem=remote.fs)
    assert main(["compare", str(a), str(remote), "--output", f"{s3}/cmp"]) == 0
    written = json.loads((location(f"{s3}/cmp") / COMPARISON_JSON).read_text())
    assert written["comparisons"][0]["b"] == f"{s3}/runs/b"
    assert written["comparisons"][0]["tasks"] == compared(a, b)["comparisons"][0]["tasks"]
    only_results = location(f"{s3}/runs/results-only")
    pafs.copy_files(str(b / "results.json"), (only_results / "results.json").path,
                    destination_filesystem=only_results.fs)
    assert main(["report", str(only_results), "--output", f"{s3}/report.html"]) == 0
    assert f"raylm report: {s3}/runs/results-only" in location(f"{s3}/report.html").read_text()
    assert capsys.readouterr().out.endswith(f"report written to {s3}/report.html\n")


# Corpus runs: the pooled bits per byte, then two `raylm ppl --domain-column path` outputs on the same documents.

def _slow_pooled(nll_a, nll_b, units) -> tuple[float, float, float, float]:
    """(a, b, paired se, unpaired se) as a float64 loop: bits per unit pooled over the documents and the ratio
    estimator's delta-method standard error, term by term."""
    ln2 = math.log(2)

    def se(d: list[float]) -> float:
        ratio = sum(d) / sum(units)
        return math.sqrt(len(d) / (len(d) - 1) * sum((x - ratio * u) ** 2 for x, u in zip(d, units))) / sum(units)

    a, b = (math.fsum(nll) / sum(units) / ln2 for nll in (nll_a, nll_b))
    paired = se([(y - x) / ln2 for x, y in zip(nll_a, nll_b)])
    return a, b, paired, math.hypot(se([x / ln2 for x in nll_a]), se([y / ln2 for y in nll_b]))


def test_pooled_bits_per_byte_difference_is_the_ratio_estimators_against_a_loop_and_by_hand():
    rng = np.random.default_rng(7)
    units = rng.integers(1, 400, 60)
    nll_a = units * rng.uniform(1.0, 3.0, 60)
    nll_b = nll_a + units * rng.normal(0.05, 0.1, 60)
    out = pooled_bits_difference(nll_a, nll_b, units)
    a, b, paired, unpaired = _slow_pooled(nll_a.tolist(), nll_b.tolist(), units.tolist())
    assert (out.n, out.a, out.b, out.diff) == (60, a, b, b - a)  # the corpus run's own formula, to the bit
    assert out.diff_stderr == pytest.approx(paired, rel=1e-12)
    assert out.unpaired_stderr == pytest.approx(unpaired, rel=1e-12)
    assert out.p_value == pytest.approx(math.erfc(abs(out.diff / paired) / math.sqrt(2)), rel=1e-12)
    assert (out.ci95_low, out.ci95_high) == pytest.approx((out.diff - Z95 * paired, out.diff + Z95 * paired))
    # By hand: 1, 1 and 2 bytes moved by 0, 2 and 2 bits: D = 4 / 4 = 1 bit per byte, residuals d_i - D bytes_i =
    # (-1, 1, 0), se = sqrt(3 / 2 * 2) / 4 = sqrt(3) / 4.
    hand = pooled_bits_difference(np.zeros(3), np.array([0.0, 2.0, 2.0]) * math.log(2), np.array([1, 1, 2]))
    assert (hand.a, hand.diff, hand.diff_stderr) == (0.0, pytest.approx(1.0), pytest.approx(math.sqrt(3) / 4))
    # every byte moved by the same: no spread, and p = 0
    even = pooled_bits_difference(np.zeros(2), np.array([1.0, 3.0]) * math.log(2), np.array([1, 3]))
    assert (even.diff_stderr, even.p_value) == (pytest.approx(0.0, abs=1e-15), 0.0)
    # the macro average of two domains: the mean of their figures, se sqrt(0.3² + 0.4²) / 2 = 0.25
    part = pooled_bits_difference(np.zeros(3), np.ones(3), np.ones(3, np.int64))
    parts = [dataclasses.replace(part, diff_stderr=0.3), dataclasses.replace(part, n=5, b=2.0, diff_stderr=0.4)]
    macro = macro_difference(parts)
    assert (macro.n, macro.a, macro.b, macro.diff, macro.diff_stderr) == (
        8, part.a, (part.b + 2.0) / 2, (part.b + 2.0) / 2 - part.a, pytest.approx(0.25))


CORPUS_FILES = ("/corpus/lines/val0.jsonl.gz", "/corpus/heads/val0.jsonl.gz", "/corpus/long/val0.jsonl.gz")


@pytest.fixture(scope="module")
def corpus_runs(tiny_llama, tiny_gpt2, tmp_path_factory):
    """The same 24 documents in three files (WikiText lines, their first words, stretches of lines), each file a
    domain (--domain-column path), scored by tiny_llama (a) and tiny_gpt2 (b): two tokenizers, one bits per byte."""
    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()][:24]
    texts = lines[:10] + [" ".join(t.split()[:3]) for t in lines[10:18]] + [" ".join(lines[k:k + 3])
                                                                           for k in range(18, 24)]
    paths = [CORPUS_FILES[0]] * 10 + [CORPUS_FILES[1]] * 8 + [CORPUS_FILES[2]] * 6
    corpus = pa.table({"text": texts, "path": paths})
    root = tmp_path_factory.mktemp("corpus-runs")
    return tuple(write_ppl_output(root / name, ModelSpec(str(model), dtype="float32", device="cpu"), corpus, 64)
                 for name, model in (("llama", tiny_llama), ("gpt2", tiny_gpt2)))


def test_corpus_runs_compare_bits_per_byte_as_their_results_json_report_it(corpus_runs):
    """Per domain, for the corpus and for the macro average: a and b are each run's reported bits per byte, the
    difference is theirs to 1e-12, the standard errors a float64 loop's over the samples' rows."""
    a, b = corpus_runs
    pair = compared(a, b)["comparisons"][0]
    reported = [json.loads((run / "results.json").read_text())["results"]["ppl"] for run in (a, b)]
    rows = [pq.read_table(run / "samples" / "ppl.parquet").to_pydict() for run in (a, b)]
    domains = sorted(CORPUS_FILES)
    assert list(pair["tasks"]) == ["ppl", *(f"ppl/{d}" for d in domains), "ppl macro"]
    assert (pair["refused"], pair["only_in_a"], pair["only_in_b"]) == ({}, [], [])
    expected = {"ppl": reported, **{f"ppl/{d}": [r["domains"][d] for r in reported] for d in domains},
                "ppl macro": [r["macro"] for r in reported]}
    for name, (ra, rb) in expected.items():
        entry = pair["tasks"][name]
        assert (entry["metric"], list(entry["metrics"])) == ("bits_per_byte", ["bits_per_byte"])
        assert (entry["a"], entry["b"]) == (ra["bits_per_byte"], rb["bits_per_byte"]), name  # to the bit
        assert entry["diff"] == pytest.approx(rb["bits_per_byte"] - ra["bits_per_byte"], abs=1e-12)
    for name, keep in [("ppl", [True] * 24), *((f"ppl/{d}", [p == d for p in rows[0]["path"]]) for d in domains)]:
        nll_a, nll_b, units = ([x for x, k in zip(column, keep) if k]
                               for column in (rows[0]["nll"], rows[1]["nll"], rows[0]["bytes"]))
        _, _, paired, unpaired = _slow_pooled(nll_a, nll_b, units)
        entry = pair["tasks"][name]
        assert entry["n"] == len(units) and entry["diff_stderr"] == pytest.approx(paired, rel=1e-12), name
        assert entry["unpaired_stderr"] == pytest.approx(unpaired, rel=1e-12), name
        assert entry["p_value"] == pytest.approx(math.erfc(abs(entry["diff"] / paired) / math.sqrt(2)), rel=1e-9)
    per_domain = [pair["tasks"][f"ppl/{d}"]["diff_stderr"] for d in domains]
    macro = pair["tasks"]["ppl macro"]
    assert macro["n"] == 24 and macro["diff_stderr"] == pytest.approx(math.sqrt(sum(s * s for s in per_domain)) / 3)
    assert rows[0]["tokens"] != rows[1]["tokens"]  # other tokenizers: bits per byte compares them all the same


def _changed_copy(run, to, change):
    shutil.copytree(run, to)
    samples = to / "samples" / "ppl.parquet"
    pq.write_table(change(pq.read_table(samples)), samples)
    return to


def test_corpus_runs_on_other_documents_are_refused_in_one_line_and_numbers_not_their_own_refused(
        corpus_runs, runs, tmp_path):
    a, b = corpus_runs
    fewer = _changed_copy(b, tmp_path / "fewer", lambda t: t.slice(0, 23))
    with pytest.raises(RaylmError, match=rf"^ppl: {a} and {fewer} are not on the same documents \(24 and 23: "
                                         r"another --data or --limit-docs\)$"):
        compared(a, fewer)
    grown = _changed_copy(b, tmp_path / "grown", lambda t: t.set_column(
        t.column_names.index("bytes"), "bytes", pa.array([n + (k == 5) for k, n in enumerate(t["bytes"].to_pylist())])))
    with pytest.raises(RaylmError, match=rf"^ppl: {a} and {grown} hold other documents: document 5's bytes is \d+ "
                                         r"and \d+ \(other data, or another order\)$"):
        compared(a, grown)
    # a results.json its samples do not give: that figure is refused, in a line naming the run
    edited = tmp_path / "edited"
    shutil.copytree(b, edited)
    data = json.loads((edited / "results.json").read_text())
    data["results"]["ppl"]["domains"][CORPUS_FILES[1]]["bits_per_byte"] = 9.5
    (edited / "results.json").write_text(json.dumps(data))
    pair = compared(a, edited)["comparisons"][0]
    assert list(pair["refused"]) == [f"ppl/{CORPUS_FILES[1]}"] and "ppl macro" in pair["tasks"]
    assert pair["refused"][f"ppl/{CORPUS_FILES[1]}"]["bits_per_byte"].startswith(f"{edited} reports 9.5, its "
                                                                               "documents give ")
    with pytest.raises(RaylmError, match="no two runs of one kind to compare"):  # an evaluation and a corpus run
        compared(runs[0], a)
    bare = tmp_path / "results-only"
    bare.mkdir()
    shutil.copy(b / "results.json", bare / "results.json")
    with pytest.raises(RaylmError, match=rf"^ppl: no samples/ppl.parquet \(a row per document\) in {bare}$"):
        compared(a, bare)


def test_the_command_prints_and_writes_the_corpus_rows(corpus_runs, tmp_path, capsys):
    a, b = corpus_runs
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out.splitlines()
    pair = compared(a, b)["comparisons"][0]
    for name, entry in pair["tasks"].items():
        head = f"{name:<36} {'bits_per_byte':<24}"
        n, shown_a, shown_b, diff = next(row for row in printed if row.startswith(head))[len(head):].split()[:4]
        assert (int(n), float(shown_a), float(shown_b), float(diff)) == (
            entry["n"], pytest.approx(entry["a"], abs=5e-5), pytest.approx(entry["b"], abs=5e-5),
            pytest.approx(entry["diff"], abs=5e-5))
    lines = (tmp_path / "cmp" / COMPARISON_CSV).read_text().splitlines()
    assert [row.split(",")[2:4] for row in lines[1:]] == [[name, "bits_per_byte"] for name in pair["tasks"]]
    assert json.loads((tmp_path / "cmp" / COMPARISON_JSON).read_text())["comparisons"][0]["tasks"] == pair["tasks"]


def test_a_sweeps_corpus_points_compare_with_its_first_corpus_point(runs, corpus_runs, tmp_path):
    """A sweep whose models each have an eval point and two corpus points (corpus-<name>, raylm ppl outputs): the
    eval points pair with the first eval point, each corpus's points with that corpus's first point."""
    a, b, _, _ = runs
    ca, cb = corpus_runs
    sweep = tmp_path / "sweep"
    for model, point, run in (("llama", "fp32", a), ("gpt2", "fp32", b), ("llama", "corpus-wiki", ca),
                              ("gpt2", "corpus-wiki", cb), ("llama", "corpus-more", ca), ("gpt2", "corpus-more", cb)):
        shutil.copytree(run, sweep / model / point)
        if point == "corpus-more":  # another corpus: results.json names other data
            results = json.loads((sweep / model / point / "results.json").read_text())
            results["config"]["data"] = "more.jsonl.gz"
            (sweep / model / point / "results.json").write_text(json.dumps(results))
    (sweep / "summary.csv").write_text("model,point\nllama,fp32\ngpt2,fp32\n")  # corpus points after, by name
    found = find_runs(sweep)
    assert [(r.label, r.corpus) for r in found] == [(f"{sweep}/llama/fp32", None), (f"{sweep}/gpt2/fp32", None),
                                                    (f"{sweep}/gpt2/corpus-more", "ppl"),
                                                    (f"{sweep}/gpt2/corpus-wiki", "ppl"),
                                                    (f"{sweep}/llama/corpus-more", "ppl"),
                                                    (f"{sweep}/llama/corpus-wiki", "ppl")]
    out = compared(sweep)
    assert out["baseline"] == f"{sweep}/llama/fp32"
    assert [(p["a"], p["b"]) for p in out["comparisons"]] == [
        (f"{sweep}/llama/fp32", f"{sweep}/gpt2/fp32"), (f"{sweep}/gpt2/corpus-more", f"{sweep}/llama/corpus-more"),
        (f"{sweep}/gpt2/corpus-wiki", f"{sweep}/llama/corpus-wiki")]
    assert out["comparisons"][0]["tasks"] == compared(a, b)["comparisons"][0]["tasks"]
    expected = compared(cb, ca)["comparisons"][0]["tasks"]
    assert out["comparisons"][1]["tasks"] == out["comparisons"][2]["tasks"] == expected
