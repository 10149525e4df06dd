"""`raylm contamination` over Ray Data: a corpus of real text with benchmark documents injected (verbatim, re-cased,
re-punctuated, re-wrapped across lines) and near misses (12 shared words); the dirty set is exactly the injected
set and equal to a reference built from lm-eval's own Janitor, for 1 and 2 actors and in every format; an actor
killed mid-corpus is replaced without changing a number; a failing actor or a bad row leaves nothing behind.
Then `raylm eval --decontaminate`: its `_decontaminate` metrics are lm-eval's own on the clean documents alone
(simple_evaluate's `samples=`), for lm-eval tasks, their groups and native tasks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import lm_eval
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from lm_eval.api.model import LM

import raylm.contamination.scan as scan_module
from conftest import DATA, restart_ray, tasks_only
from raylm.cli import main
from raylm.config import EvalConfig
from raylm.contamination.documents import load_scan_tasks
from raylm.contamination.ngrams import normalize
from raylm.contamination.report import contamination_dict, write_report
from raylm.contamination.scan import NgramScan, ScanConfig, run_scan
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.results.decontamination import clean_documents
from raylm.results.contamination import CleanSets, query_digest
from raylm.storage.lock import LOCK_FILE
from raylm.results.lmeval import results
from raylm.results.report import results_dict
from raylm.models.spec import ModelSpec
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import select

with contextlib.redirect_stdout(io.StringIO()):  # it prints that its C++ module is missing, with a traceback
    from lm_eval.decontamination.janitor import Janitor, word_ngrams

N = 13
TASKS = ("winogrande", "hellaswag", "wikitext", "arc_easy_local", "mmlu_local_stem")
SCAN_LIMIT = 30
EVAL_LIMIT = 4  # the documents `raylm eval --decontaminate` scores (within the scanned ones)
OFF_VOCAB = "zqxjvk"  # no benchmark has this word, so no n-gram spans it
SEEDS = (0, 1234, 1234, 1234)


def janitor_grams(text: str) -> list[str]:
    """lm-eval's own n-grams of a text (decontaminate.py's: word_ngrams of Janitor.normalize_string)."""
    return list(word_ngrams(Janitor().normalize_string(text), N))


@pytest.fixture(scope="module")
def scan_tasks(local_tasks):
    return load_scan_tasks(TASKS, DATA, local_tasks, SCAN_LIMIT)


def reference_lookup(scan_tasks) -> dict[str, set[tuple[str, int]]]:
    """decontaminate.py's lookup: n-gram -> the (task, doc_id) whose queries hold it."""
    lookup: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for task in scan_tasks.tasks.values():
        for doc_id, query in task.queries:
            for gram in janitor_grams(query):
                lookup[gram].add((task.name, doc_id))
    return lookup


def recased(text: str) -> str:
    return "".join(c.swapcase() if c.isascii() else c for c in text)


def repunctuated(text: str) -> str:
    """Punctuation removed where it was and added where it was not, words kept (as the Janitor sees them)."""
    marks = [",", "!", "...", ")", "'", "?!"]
    out = []
    for i, word in enumerate(text.split()):
        bare = "".join(c for c in word if c not in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") or word
        out.append(f"({bare}{marks[i % len(marks)]}" if i % 3 == 0 else bare)
        if i % 4 == 1:
            out.append("--")  # a word of punctuation alone: nothing once normalised
    return " ".join(out)


def rewrapped(text: str) -> str:
    words = text.split()
    return "".join(w + ("\n" if i % 4 == 3 else "\n\n   " if i % 7 == 6 else " ") for i, w in enumerate(words))


VARIANTS = (lambda t: t, recased, repunctuated, rewrapped)


@pytest.fixture(scope="module")
def corpus(scan_tasks):
    """WikiText-2 validation text (real text, disjoint from the test pages) in documents of three lines (those that
    share no n-gram with a task document by themselves), with task
    documents hidden in some, and near misses (the first 12 words and the next 12 of a document, split by a word
    no task has) in others. Documents are injected whole, and one WikiText page as a 40-word excerpt; each
    injected document holds no n-gram any other task document has, so exactly it must be found."""
    lookup = reference_lookup(scan_tasks)
    lines = [line.strip() for line in (DATA / "wikitext-2" / "valid.txt").read_text().splitlines() if line.strip()]
    texts = ["\n".join(lines[i:i + 3]) for i in range(0, 3 * 160, 3)]
    # Real text shares n-grams with benchmarks by itself: WikiText's runs of 13 "<unk>" are in test pages too.
    texts = [t for t in texts if not any(g in lookup for g in janitor_grams(t))][:150]
    rng = random.Random(0)
    injected: dict[str, set[int]] = defaultdict(set)
    near: dict[str, set[int]] = defaultdict(set)
    variant = 0
    for task in scan_tasks.tasks.values():
        unique = [(d, q) for d, q in task.queries
                  if janitor_grams(q) and all(lookup[g] == {(task.name, d)} for g in janitor_grams(q))]
        chosen = [x for x in unique if x[0] < EVAL_LIMIT][:2] or unique[:2]
        misses = [x for x in unique if x not in chosen and len(x[1].split()) >= 2 * N][:1]
        if task.name == "wikitext":  # a page: a 40-word excerpt of page 1 (evaluated), a near miss of page 2
            chosen = [(d, " ".join(q.split()[200:240])) for d, q in task.queries if d == 1]
            misses = [(d, q) for d, q in task.queries if d == 2]
        for doc_id, query in chosen:
            at = rng.randrange(len(texts))
            texts[at] = f"{texts[at]}\n{VARIANTS[variant % len(VARIANTS)](query)} {texts[(at + 1) % len(texts)][:80]}"
            injected[task.name].add(doc_id)
            variant += 1
        for doc_id, query in misses:
            words = query.split()
            at = rng.randrange(len(texts))
            texts[at] = (f"{texts[at]} {OFF_VOCAB} {' '.join(words[:N - 1])} {OFF_VOCAB} "
                         f"{' '.join(words[N:2 * N - 1])} {OFF_VOCAB}")
            near[task.name].add(doc_id)
    assert sum(map(len, injected.values())) >= 9 and sum(map(len, near.values())) >= 5
    assert set(injected) == set(scan_tasks.tasks)
    return texts, dict(injected), dict(near)


def reference_scan(scan_tasks, texts: list[str]) -> tuple[dict[str, set[int]], Counter, Counter]:
    """lm-eval's decontamination on the same data, with its own Janitor: each corpus document's n-grams looked up;
    the dirty documents, each task document's distinct n-grams found, and the match rows."""
    lookup = reference_lookup(scan_tasks)
    dirty: dict[str, set[int]] = defaultdict(set)
    found: dict[tuple[str, int], set[str]] = defaultdict(set)
    rows: Counter = Counter()
    for row, text in enumerate(texts):
        for gram in janitor_grams(text):
            for task, doc_id in lookup.get(gram, ()):
                dirty[task].add(doc_id)
                found[(task, doc_id)].add(gram)
                rows[(task, doc_id, row, gram)] += 1
    return dict(dirty), Counter({k: len(v) for k, v in found.items()}), rows


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
    return path


def dirty_sets(report: dict) -> dict[str, set[int]]:
    return {name: {d["doc_id"] for d in t["docs"] if d["matched_ngrams"]} for name, t in report["tasks"].items()
            if any(d["matched_ngrams"] for d in t["docs"])}


def scan(local_tasks, corpus_paths, out: Path, **kwargs):
    cfg = ScanConfig(TASKS, tuple(map(str, corpus_paths)), text_column="body", data_dir=DATA,
                     include_path=local_tasks, limit=SCAN_LIMIT, progress=False, **kwargs)
    result = run_scan(cfg, out)
    return result, write_report(result, out), pq.read_table(out / "matches.parquet")


@pytest.fixture(scope="module")
def jsonl_scan(ray_restarted_after, local_tasks, corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scan")
    path = write_jsonl(tmp / "corpus.jsonl", corpus[0])
    return path, tmp / "out", *scan(local_tasks, [path], tmp / "out", actors=1)


def test_the_dirty_set_is_exactly_the_injected_one_and_lm_evals(scan_tasks, corpus, jsonl_scan):
    texts, injected, near = corpus
    path, _, result, report, matches = jsonl_scan
    dirty, found, rows = reference_scan(scan_tasks, texts)
    assert dirty_sets(report) == injected == dirty
    assert not any(doc_id in dirty.get(task, ()) for task, ids in near.items() for doc_id in ids)
    for name, task in report["tasks"].items():
        for doc in task["docs"]:
            assert doc["matched_ngrams"] == found.get((name, doc["doc_id"]), 0), (name, doc["doc_id"])
            if doc["doc_id"] in injected.get(name, ()) and name != "wikitext":
                assert doc["contaminated_fraction"] == 1.0 and doc["matched_ngrams"] == doc["ngrams"]
    page = next(d for d in report["tasks"]["wikitext"]["docs"] if d["doc_id"] == 1)
    page_grams = janitor_grams(scan_tasks.tasks["wikitext"].queries[1][1])
    excerpt = set(janitor_grams(" ".join(scan_tasks.tasks["wikitext"].queries[1][1].split()[200:240])))
    covered = {k + j for k, g in enumerate(page_grams) if g in excerpt for j in range(N)}
    assert page["matched_ngrams"] == len(excerpt) and 0 < page["contaminated_fraction"] < 0.1
    assert page["contaminated_fraction"] == len(covered) / page["words"]
    ours = Counter(zip(matches["task"].to_pylist(), matches["doc_id"].to_pylist(), matches["row"].to_pylist(),
                       matches["ngram"].to_pylist()))
    assert ours == rows and set(matches["file"].to_pylist()) == {str(path)}
    for row, offset, gram in zip(matches["row"].to_pylist(), matches["offset"].to_pylist(),
                                 matches["ngram"].to_pylist()):
        assert normalize(texts[row][offset:]).split()[:N] == gram.split()
    assert report["corpus"]["rows"] == len(texts) and report["corpus"]["hash_collisions"] == 0
    assert result.collisions == 0 and report["corpus"]["bytes"] == sum(len(t.encode()) for t in texts)
    mmlu = report["groups"]["mmlu_local_stem"]
    leaves = [t for t in report["tasks"] if t.startswith("mmlu_") and t.endswith("_local")]
    assert mmlu["documents"] == sum(report["tasks"][t]["documents"] for t in leaves) == 3 * SCAN_LIMIT
    assert mmlu["dirty"] == sum(report["tasks"][t]["dirty"] for t in leaves) == sum(
        len(injected.get(t, ())) for t in leaves)
    wg = report["tasks"]["winogrande"]
    assert wg["query"] == "doc_to_decontamination_query: sentence" and wg["original"] == 1267
    assert wg["fraction_dirty"] == pytest.approx(len(injected["winogrande"]) / SCAN_LIMIT)


def test_two_actors_over_parquet_shards_find_the_same(local_tasks, corpus, jsonl_scan, tmp_path):
    """Same documents as two Parquet files in small batches on two actors: the same report and match rows (row
    numbers now count within each file)."""
    texts = corpus[0]
    _, _, _, expected, expected_matches = jsonl_scan
    half = len(texts) // 2
    paths = []
    for i, part in enumerate((texts[:half], texts[half:])):
        paths.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(pa.table({"body": part}), paths[-1], row_group_size=16)
    _, report, matches = scan(local_tasks, [tmp_path / "part-*.parquet"], tmp_path / "out", actors=2,
                              docs_per_batch=8)
    assert report["tasks"] == expected["tasks"] and report["groups"] == expected["groups"]
    offset = {str(paths[0]): 0, str(paths[1]): half}
    rows = [offset[f] + r for f, r in zip(matches["file"].to_pylist(), matches["row"].to_pylist())]
    assert rows == expected_matches["row"].to_pylist()
    assert matches.drop_columns(["file", "row"]).equals(expected_matches.drop_columns(["file", "row"]))


@pytest.mark.slow  # a Ray of its own
def test_a_text_file_row_is_its_line_number(tmp_path):
    """One document per line; an empty line is a row too, so a match's row is the line's index in the file."""
    tasks = load_scan_tasks(("winogrande",), DATA, None, 5)
    sentence = tasks.tasks["winogrande"].queries[4][1]
    lines = ["first line", "", "", f"third {sentence.upper()}", "", "last"]
    (tmp_path / "a.txt").write_text("".join(line + "\n" for line in lines))
    cfg = ScanConfig(("winogrande",), (str(tmp_path / "a.txt"),), data_dir=DATA, limit=5, progress=False)
    report = contamination_dict(run_scan(cfg, tmp_path / "out"))
    matches = pq.read_table(tmp_path / "out" / "matches.parquet")
    assert set(matches["row"].to_pylist()) == {3} and report["corpus"]["rows"] == 6
    assert dirty_sets(report) == reference_scan(tasks, lines)[0] and 4 in dirty_sets(report)["winogrande"]


# Workers cannot import this test module, so its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DiesOnce(NgramScan):
    """Kills its own process on its third batch, the first time only (a marker file remembers): an OOM kill or a
    lost node, as far as Ray Data can tell."""

    marker = ""

    def __call__(self, batch):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super().__call__(batch)


class Fails(NgramScan):
    def __call__(self, batch):
        raise RuntimeError("scanning bug")


def test_an_actor_killed_mid_corpus_is_replaced_and_nothing_changes(local_tasks, jsonl_scan, monkeypatch, tmp_path):
    path, _, _, expected, expected_matches = jsonl_scan
    marker = tmp_path / "died"
    monkeypatch.setattr(DiesOnce, "marker", str(marker))
    monkeypatch.setattr(scan_module, "NgramScan", DiesOnce)
    _, report, matches = scan(local_tasks, [path], tmp_path / "out", actors=1, docs_per_batch=8)
    assert marker.exists()
    assert report["tasks"] == expected["tasks"] and matches.equals(expected_matches)


def test_cli_prints_the_table_writes_the_chart_and_keeps_what_is_not_its_own(ray_session, corpus, tmp_path, capsys):
    """The command line through main() on the session's Ray, before the scans that end in errors below."""
    data = write_jsonl(tmp_path / "corpus.jsonl", corpus[0])
    out = tmp_path / "out"
    args = ["contamination", "--tasks", "winogrande,hellaswag", "--corpus", str(data), "--text-column", "body",
            "--data-dir", str(DATA), "--limit", str(SCAN_LIMIT), "--output", str(out), "--no-progress"]
    capsys.readouterr()
    assert main(args) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| winogrande")]
    dirty = len(corpus[1]["winogrande"])
    assert table and table[0].split("|")[2:4] == [f" {SCAN_LIMIT:>9} ", f" {dirty:>7} "]
    assert (out / "contamination.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((out / "contamination.json").read_text())
    assert report["config"]["command"] == "contamination" and set(report["tasks"]) == {"winogrande", "hellaswag"}
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "contamination.json").write_text('{"mine": true}')
    assert main([*args[:-3], "--output", str(foreign), "--no-progress"]) == 2  # refused before any scan
    assert "was not written by raylm" in capsys.readouterr().err
    assert (foreign / "contamination.json").read_text() == '{"mine": true}'


def test_a_failing_actor_or_a_bad_row_is_one_line_and_leaves_nothing(jsonl_scan, monkeypatch, tmp_path):
    """Last of the scans: a stream that ends in an error may leave its actors holding the session Ray's CPUs until
    Ray Data or Python's cyclic collection ends them, so each failure here is followed by a fresh Ray (the eval
    tests after it waited for ever on CPUs a failed scan's actor held)."""
    path = jsonl_scan[0]

    def native_scan(paths, out):
        cfg = ScanConfig(("winogrande",), tuple(map(str, paths)), text_column="body", data_dir=DATA, limit=5,
                         actors=1, progress=False)
        return run_scan(cfg, out)

    monkeypatch.setattr(scan_module, "NgramScan", Fails)
    with pytest.raises(RaylmError, match=r"^contamination scan failed: RuntimeError: scanning bug$"):
        native_scan([path], tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == [LOCK_FILE]  # released, empty; no partial matches
    monkeypatch.undo()
    restart_ray()
    pq.write_table(pa.table({"body": ["fine", None]}), tmp_path / "nulls.parquet")
    with pytest.raises(RaylmError, match=r"nulls\.parquet: field 'text': expected a document's text, got NoneType"):
        native_scan([tmp_path / "nulls.parquet"], tmp_path / "out2")
    assert [p.name for p in (tmp_path / "out2").iterdir()] == [LOCK_FILE]
    restart_ray()  # the tests after this one in the module score on actors of their own


class ReplayLM(LM):
    """An lm-eval model answering from raylm's scores. lm-eval numbers the documents `samples=` selects 0, 1, ...,
    so request (task, j, idx) is the j-th selected document's."""

    def __init__(self, scores: dict, selected: dict[str, list[int]]):
        super().__init__()
        self.scores, self.selected = scores, selected

    def _answer(self, requests):
        return [self.scores[(r.task_name, self.selected[r.task_name][r.doc_id], r.idx)] for r in requests]

    loglikelihood = loglikelihood_rolling = _answer

    def generate_until(self, requests):
        raise NotImplementedError


def assert_decontaminated_are_lm_evals(ours: dict, theirs: dict, names) -> None:
    for name in names:
        section = "groups" if name in theirs.get("groups", {}) else "results"
        expected = {k: v for k, v in theirs[section][name].items()
                    if k not in ("name", "alias", "sample_len", "sample_count")}
        assert expected
        for key, count in theirs[section][name].get("sample_count", {}).items():
            metric, _, filter_key = key.partition(",")
            assert ours[section][name]["sample_count"][f"{metric}_decontaminate,{filter_key}"] == count
        for key, value in expected.items():
            metric, _, filter_key = key.partition(",")
            if metric.endswith("_stderr"):
                mine = f"{metric[:-len('_stderr')]}_decontaminate_stderr,{filter_key}"
            else:
                mine = f"{metric}_decontaminate,{filter_key}"
            assert ours[section][name][mine] == pytest.approx(value, rel=1e-12, abs=0) if isinstance(value, float) \
                else ours[section][name][mine] == value, (name, key)


def test_decontaminated_metrics_are_lm_evals_on_the_clean_documents_alone(local_tasks):
    """lm-eval tasks, a group of groups, and a rolling task, with random scores: raylm's `_decontaminate` metrics
    are what lm-eval's simple_evaluate reports when `samples=` selects the clean documents."""
    tasks_dir = local_tasks
    names = ["arc_easy_local", "mmlu_local"]
    built = load_and_build(select(names, tasks_dir), SEEDS, None, 12)
    rng = np.random.default_rng(3)
    scores = {}
    for task in built.tasks["tasks"]:
        for r in built.requests(task):
            scores[(task, r.doc_id, r.idx)] = (float(-rng.gamma(2.0, 10.0)), bool(rng.random() < 0.2))
    clean = {task: {d for d in range(12) if rng.random() < 0.6} | {0} for task in built.tasks["tasks"]}
    plain = results(built, scores, 100)
    ours = results(built, scores, 100, clean=clean)
    def full_pass(entry: dict) -> dict:
        out = {k: v for k, v in entry.items() if "_decontaminate" not in k}
        if "sample_count" in out:
            out["sample_count"] = {k: v for k, v in out["sample_count"].items() if "_decontaminate" not in k}
        return out

    assert {n: full_pass(m) for n, m in ours["results"].items()} == plain["results"]
    selected = {task: sorted(ids) for task, ids in clean.items()}
    theirs = lm_eval.simple_evaluate(model=ReplayLM(scores, selected), tasks=names,
                                     task_manager=tasks_only(tasks_dir), samples=selected,
                                     bootstrap_iters=100, random_seed=SEEDS[0], numpy_random_seed=SEEDS[1],
                                     torch_random_seed=SEEDS[2], fewshot_random_seed=SEEDS[3])
    assert_decontaminated_are_lm_evals(ours, theirs, [*built.tasks["tasks"], *theirs["groups"]])
    for task in built.tasks["tasks"]:
        assert ours["n-samples"][task] == {"original": plain["n-samples"][task]["original"], "effective": 12,
                                           "decontaminate": len(clean[task])}
    assert ours["higher_is_better"]["arc_easy_local"]["acc_norm_decontaminate"] is True
    none_clean = results(load_and_build(select(["arc_easy_local"], tasks_dir), SEEDS, None, 12), scores, 0,
                         clean={"arc_easy_local": set()})
    assert not any("_decontaminate" in k for k in none_clean["results"]["arc_easy_local"])
    assert none_clean["n-samples"]["arc_easy_local"]["decontaminate"] == 0


def test_samples_are_decontaminated_by_their_own_index(local_tasks):
    """`--samples` with `--decontaminate` on an lm-eval task: lm-eval numbers the sampled documents 0, 1, ..., the
    scan names every document by its own index. The clean set is the sampled documents the scan found clean, and
    the `_decontaminate` metrics and counts are lm-eval's own over exactly those (documents 0-2, dirty but not
    sampled, carry the doc_ids lm-eval gives three of the sampled ones)."""
    name = "arc_easy_local"
    samples = [3, 5, 8, 11, 14, 17]
    dirty = {0, 1, 2, 5, 11}
    queries = load_scan_tasks((name,), DATA, local_tasks, None).tasks[name].queries
    scan = CleanSets({"config": {"command": "contamination"}, "tasks": {name: {"docs": [
        {"doc_id": d, "query_sha256": query_digest(q), "matched_ngrams": int(d in dirty)} for d, q in queries]}}},
        Path("contamination.json"))
    cfg = EvalConfig(ModelSpec("unused"), (name,), DATA, include_path=local_tasks, samples={name: samples})
    built = load_and_build(select([name], local_tasks), SEEDS, None, None, cfg.samples)
    clean, evaluated = clean_documents(cfg, scan, {}, built)
    assert clean == {name: {3, 8, 14, 17}} and evaluated == {name: len(samples)}
    rng = np.random.default_rng(5)
    scores = {(name, r.doc_id, r.idx): (float(-rng.gamma(2.0, 10.0)), bool(rng.random() < 0.2))
              for r in built.requests(name)}
    ours = results(built, scores, 100, clean=clean)
    assert ours["n-samples"][name]["effective"] == len(samples) and ours["n-samples"][name]["decontaminate"] == 4
    # lm-eval on the clean sampled documents alone, answered with raylm's score of each (its k-th sampled one)
    by_index = {(task, samples[doc_id], idx): score for (task, doc_id, idx), score in scores.items()}
    selected = {name: sorted(clean[name])}
    theirs = lm_eval.simple_evaluate(model=ReplayLM(by_index, selected), tasks=[name],
                                     task_manager=tasks_only(local_tasks), samples=selected,
                                     bootstrap_iters=100, random_seed=SEEDS[0], numpy_random_seed=SEEDS[1],
                                     torch_random_seed=SEEDS[2], fewshot_random_seed=SEEDS[3])
    assert_decontaminated_are_lm_evals(ours, theirs, [name])


def test_eval_command_line_takes_the_documented_flags(ray_session, tiny_llama, corpus, jsonl_scan, tmp_path, capsys):
    """`raylm eval` with documented flags whose effects other tests check through EvalConfig (--decontaminate
    above, --samples and --system-instruction against lm-eval's goldens, 4-bit loading, GPUs per actor): each
    reaches the run from the command line, as results.json and the sample log show (tests/test_docs.py asks
    that some test run every documented flag)."""
    _, scan_dir, _, _, _ = jsonl_scan
    chosen = [3, 0, 2]
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_llama), "--tasks", "winogrande", "--data-dir", str(DATA), "--samples",
                 json.dumps({"winogrande": chosen}), "--system-instruction", "Pick one.", "--load-in-4bit",
                 "--num-gpus", "0", "--decontaminate", str(scan_dir), "--output", str(out), "--log-samples",
                 "--no-progress"]) == 0, capsys.readouterr().err[-2000:]
    results = json.loads((out / "results.json").read_text())
    clean = [d for d in chosen if d not in corpus[1]["winogrande"]]
    assert results["n-samples"]["winogrande"]["effective"] == 3
    assert results["n-samples"]["winogrande"]["decontaminate"] == len(clean) < 3
    assert results["config"]["quantization"] == "4bit" and results["config"]["num_gpus"] == 0
    [log] = (out / "samples").glob("samples_winogrande_*.jsonl")
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["doc_id"] for s in logged] == sorted(chosen)
    assert all(a["arg_0"].startswith("Pick one.") for s in logged for a in s["arguments"].values())


def test_eval_decontaminate_end_to_end(ray_session, tiny_llama, local_tasks, reference_tasks, corpus, jsonl_scan):
    """`raylm eval --decontaminate` on actors, native and lm-eval tasks: each native task's `_decontaminate`
    metrics are those lm-eval's own task (the golden's) reports for raylm's scores of the clean documents alone;
    lm-eval tasks carry theirs; results.json records the scan and the counts; a scan that lacks a task, or holds
    other text for a document, is refused in one line before anything is scored."""
    _, scan_dir, _, report, _ = jsonl_scan
    injected = corpus[1]
    cfg = EvalConfig(ModelSpec(str(tiny_llama), dtype="float32", device="cpu"),
                     ("winogrande", "hellaswag", "wikitext", "arc_easy_local"), DATA, EVAL_LIMIT,
                     include_path=local_tasks, actors=1, progress=False, bootstrap_iters=100, decontaminate=scan_dir)
    result = evaluate(cfg)
    out = results_dict(result)
    dirty = {t: {d for d in ids if d < EVAL_LIMIT} for t, ids in injected.items()}
    assert dirty["winogrande"] and dirty["wikitext"] == {1}
    for task in cfg.tasks:
        n_clean = EVAL_LIMIT - len(dirty.get(task, ()))
        assert out["n-samples"][task]["decontaminate"] == n_clean
        assert out["decontamination"]["tasks"][task] == {"documents": EVAL_LIMIT, "dirty": EVAL_LIMIT - n_clean,
                                                          "clean": n_clean}
    assert out["decontamination"]["source"] == str(scan_dir / "contamination.json")
    assert out["higher_is_better"]["winogrande"]["acc_decontaminate"] is True
    assert "acc_norm_decontaminate,none" in out["results"]["arc_easy_local"]
    # the native tasks against lm-eval's own tasks, answered with raylm's per-request scores
    scores = {}
    for name, golden in (("winogrande", "winogrande_local"), ("hellaswag", "hellaswag_local"),
                         ("wikitext", "wikitext_local")):
        table = result.tasks[name].scored
        for doc_id, idx, ll, greedy in zip(*(table[c].to_pylist() for c in
                                             ("doc_id", "req_idx", "loglikelihood", "is_greedy"))):
            if name == "wikitext":  # one rolling request per page: the sum over its windows
                scores[(golden, doc_id, 0)] = scores.get((golden, doc_id, 0), 0.0) + ll
            else:
                scores[(golden, doc_id, idx)] = (ll, bool(greedy))
    selected = {golden: sorted(set(range(EVAL_LIMIT)) - dirty.get(name, set()))
                for name, golden in (("winogrande", "winogrande_local"), ("hellaswag", "hellaswag_local"),
                                     ("wikitext", "wikitext_local"))}
    theirs = lm_eval.simple_evaluate(model=ReplayLM(scores, selected), tasks=list(selected),
                                     task_manager=tasks_only(reference_tasks), samples=selected,
                                     bootstrap_iters=100)
    native = out["results"]
    for name, golden in (("winogrande", "winogrande_local"), ("hellaswag", "hellaswag_local"),
                         ("wikitext", "wikitext_local")):
        for key, value in theirs["results"][golden].items():
            if key in ("name", "alias", "sample_len", "sample_count"):
                continue
            metric, _, filter_key = key.partition(",")
            mine = (f"{metric[:-len('_stderr')]}_decontaminate_stderr" if metric.endswith("_stderr")
                    else f"{metric}_decontaminate") + f",{filter_key}"
            assert native[name][mine] == (pytest.approx(value, rel=1e-9) if isinstance(value, float) else value), \
                (name, key)
    with pytest.raises(RaylmError, match=r"--decontaminate: piqa_local not scanned in '.*contamination.json'"):
        evaluate(replace(cfg, tasks=("winogrande", "piqa_local")))
    other = CleanSets(report, scan_dir)
    with pytest.raises(RaylmError, match=r"winogrande doc 0's text differs from the one scanned"):
        other.clean("winogrande", [(0, "some other sentence")])
    with pytest.raises(RaylmError, match=r"winogrande doc 99 is evaluated but was not scanned"):
        other.clean("winogrande", [(99, "x")])
    assert other.clean("winogrande", [(0, next(q for d, q in load_scan_tasks(
        ("winogrande",), DATA, None, 1).tasks["winogrande"].queries))]) == (set() if 0 in dirty["winogrande"]
                                                                           else {0})
    assert query_digest("x") == query_digest("x") != query_digest("y")


def test_a_sweep_file_takes_a_scan_for_every_point(tmp_path):
    from raylm.sweep.config import load_sweep

    (tmp_path / "scan").mkdir()
    (tmp_path / "scan" / "contamination.json").write_text("{}")
    (tmp_path / "sweep.yaml").write_text("models: [raylm:demo]\ntasks: [winogrande]\ndecontaminate: scan\n"
                                         "settings: {limit: [5, 10]}\n")
    sweep = load_sweep(tmp_path / "sweep.yaml")
    assert {sweep.config(m, p).decontaminate for m in sweep.models for p in sweep.points} == {tmp_path / "scan"}
    (tmp_path / "bad.yaml").write_text("models: [raylm:demo]\ntasks: [winogrande]\ndecontaminate: nowhere\n")
    with pytest.raises(RaylmError, match=r"bad\.yaml.*line 3.*decontaminate.*nowhere' does not exist"):
        load_sweep(tmp_path / "bad.yaml")
