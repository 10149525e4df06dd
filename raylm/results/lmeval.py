"""Scores and generations -> lm-eval's results, through lm-eval itself: filters (regex, take_first, majority vote),
process_results, aggregation, stderr, groups.

`results()` mirrors evaluate() (lm_eval/evaluator.py) from the model call's `req.resps.append(x)` to its return,
on rank 0 of 1, and then calls lm-eval's own `_process_results` and `EvalAcc._to_eval_results` (private, but
lm-eval is pinned to the 0.4.13 these mirror). Nothing here computes a metric.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from lm_eval.api.instance import Instance
from lm_eval.evaluator_utils import ResultAcc, _process_results
from lm_eval.models.utils import postprocess_generated_text
from lm_eval.utils import handle_non_serializable, hash_string

from raylm.errors import RaylmError
from raylm.results.contamination import SUFFIX, decontaminated_key
from raylm.tasks.lmeval.build import LMEVAL_LOCK, Built, cached_templates, documents
from raylm.tasks.lmeval.code_eval import CODE_EVAL, RunPrograms, run_here

# A loglikelihood request's score is (summed log-probability, continuation is the greedy decode); a rolling
# request's is its document's summed log-probability over all windows (HFLM returns a bare float for it); a
# generate_until request's is its generated texts, one per repeat.
Score = tuple[float, bool] | float | list[str]
ScoreKey = tuple[str, int, int]  # (task, doc_id, idx)
_NOT_METRICS = ("name", "alias", "sample_len", "sample_count")  # the entries of a task's or group's results


def task_scores(task: str, output_type: str, requests: pa.Table, scored: pa.Table,
                think_end_token: str | None = None) -> dict[ScoreKey, Score]:
    """A task's scores by (task, doc_id, idx) from its scored rows. Rolling windows add up in window order, as
    HFLM sums them (a plain sum); a text with no tokens has no windows and scores 0, as in HFLM. A generation's
    texts come in repeat order, each after its thinking where a think_end_token is given (thinking_stripped)."""
    if output_type == "generate_until":
        scored = scored.sort_by([("doc_id", "ascending"), ("req_idx", "ascending"), ("repeat", "ascending")])
        until = {(doc_id, idx): stops for doc_id, idx, stops in
                 zip(*(requests[c].to_pylist() for c in ("doc_id", "req_idx", "until")))} if think_end_token else {}
        texts: dict[ScoreKey, Score] = {}
        for doc_id, idx, text in zip(*(scored[c].to_pylist() for c in ("doc_id", "req_idx", "generation"))):
            if think_end_token:
                text = thinking_stripped(text, until[(doc_id, idx)], think_end_token)
            texts.setdefault((task, doc_id, idx), []).append(text)
        return texts
    scored = scored.sort_by([("doc_id", "ascending"), ("req_idx", "ascending"), ("window", "ascending")])
    docs, idxs = scored["doc_id"].to_pylist(), scored["req_idx"].to_pylist()
    logliks, greedy = scored["loglikelihood"].to_pylist(), scored["is_greedy"].to_pylist()
    out: dict[ScoreKey, Score] = {}
    if output_type == "loglikelihood_rolling":
        for doc_id, idx in zip(requests["doc_id"].to_pylist(), requests["req_idx"].to_pylist()):
            out[(task, doc_id, idx)] = 0.0
        for doc_id, idx, ll in zip(docs, idxs, logliks):
            out[(task, doc_id, idx)] += ll
    else:
        for doc_id, idx, ll, g in zip(docs, idxs, logliks, greedy):
            out[(task, doc_id, idx)] = (ll, bool(g))
    return out


def thinking_stripped(text: str, until: list[str], think_end_token: str) -> str:
    """HFLM's answer under think_end_token, by lm-eval's own postprocess_generated_text: what follows the token's
    last occurrence, leading whitespace dropped, cut at the stop strings. raylm's engine has already cut `text` at
    them (HFLM cuts after stripping); the two agree because generation stops at the first stop string, so none
    comes before the token (save one that only appears once special tokens are dropped from the text)."""
    return postprocess_generated_text(generation=text, stop=until, think_end_token=think_end_token)


def _fill(task_name: str, instances: list[Instance], scores: Mapping[ScoreKey, Score]) -> None:
    """evaluate()'s `req.resps.append(x)` for each of a request's `repeats` clones: a generation's texts in repeat
    order; a score, which is deterministic, once per clone."""
    for inst in instances:
        key = (task_name, inst.doc_id, inst.idx)
        if key not in scores:
            raise RaylmError(f"{task_name}: doc {inst.doc_id} request {inst.idx} has no score")
        score = scores[key]
        if inst.request_type == "generate_until":
            if len(score) != inst.repeats:
                raise RaylmError(f"{task_name}: doc {inst.doc_id} request {inst.idx} has {len(score)} generations "
                                 f"for {inst.repeats} repeats")
            inst.resps = list(score)
            inst.filtered_resps = {}
            continue
        if inst.request_type == "loglikelihood_rolling":
            value: Score = float(score)
        else:
            loglikelihood, is_greedy = score
            value = (float(loglikelihood), bool(is_greedy))
        inst.resps = [value] * inst.repeats
        inst.filtered_resps = {}


def _filtered_documents(name: str, task: Any, built: Built, scores: Mapping[ScoreKey, Score]
                        ) -> Iterator[tuple[str, int, dict, list[Instance]]]:
    """evaluate()'s post-processing loop over a task: its responses filled in and filtered, then per filter per
    document (filter_key, index, doc, its requests in idx order)."""
    _fill(name, task.instances, scores)
    task.apply_filters()
    by_doc: dict[int, list[Instance]] = defaultdict(list)
    for inst in task.instances:
        by_doc[inst.doc_id].append(inst)
    for instances in by_doc.values():
        instances.sort(key=lambda x: x.idx)
    for filter_key in task.instances[0].filtered_resps:
        for doc_id, index, doc in documents(task, built.limits[name], built.indices(name)):
            yield filter_key, index, doc, by_doc[doc_id]


def _run_programs(built: Built, scores: Mapping[ScoreKey, Score], run_programs: RunPrograms) -> set[str]:
    """The code tasks' programs, every one of them at once (raylm.tasks.lmeval.code_eval: each document's metric
    asked once with its programs recorded, not run); returns the code tasks' names."""
    code_tasks = {name: task for name, task in built.tasks["tasks"].items() if getattr(task, "UNSAFE_CODE", False)}

    def record() -> None:
        for name, task in code_tasks.items():
            for filter_key, _, doc, requests in _filtered_documents(name, task, built, scores):
                task.process_results(doc, [req.filtered_resps[filter_key] for req in requests])

    if code_tasks:
        CODE_EVAL.run_recorded(record, run_programs)
    return set(code_tasks)


def _logged_sample(doc_id: int, doc: dict, target: Any, requests: list[Instance], filter_key: str,
                   metrics: dict[str, Any]) -> dict[str, Any]:
    """evaluate()'s `example = {...}` for log_samples, field for field."""
    example = {
        "doc_id": doc_id,
        "doc": doc,
        "target": target,
        "arguments": [req.args for req in requests],
        "resps": [req.resps for req in requests],
        "filtered_resps": [req.filtered_resps[filter_key] for req in requests],
        "filter": filter_key,
        "metrics": list(metrics.keys()),
        "doc_hash": hash_string(json.dumps(requests[0].doc, indent=2, default=handle_non_serializable,
                                           ensure_ascii=False)),
        "prompt_hash": hash_string(requests[0].arguments[0]),
        "target_hash": hash_string(str(target)),
    }
    example.update(metrics)
    return example


def results(built: Built, scores: Mapping[ScoreKey, Score], bootstrap_iters: int = 100000,
            log_samples: bool = True, clean: Mapping[str, set[int]] | None = None,
            run_programs: RunPrograms = run_here) -> dict[str, Any]:
    """lm-eval's results dict (results, groups, group_subtasks, configs, versions, n-shot, higher_is_better,
    n-samples, and samples when log_samples) from one score per (task, doc_id, idx).

    With `clean` (task -> the documents a contamination scan found clean, by their own index in the task: under
    --samples not the doc_id lm-eval renumbers them to), every metric of every task and group is
    computed again over the clean documents alone, as lm-eval's evaluator did before 0.4.0 (each clean
    document's values appended under `<metric>_decontaminate` and aggregated with the metric's own aggregation,
    its stderr beside it), now through lm-eval 0.4.13's own aggregation, stderr and group code: a second
    _process_results over the clean documents' values, its keys renamed. A group is thus aggregated over its
    subtasks' clean documents with their clean counts as weights, exactly what lm-eval reports when asked for
    those documents alone (`samples=`); n-samples gains the clean count under `decontaminate`.

    Code tasks' programs are run by `run_programs` (on Ray: raylm.cluster.programs) before any metric is asked for;
    each logged sample of theirs also has `programs`: per program its outcome (passed, failed, timed out, killed
    by a limit) and HF code_eval's `passed` and `result`."""
    # process_docs runs again in doc_iterator and may draw from the global generators; doc_to_target is Jinja.
    with LMEVAL_LOCK, cached_templates():
        seed_langdetect()
        accumulators: dict[str, ResultAcc] = {
            name: {"task": task, "raw_metrics": defaultdict(list), "logged_samples": []}
            for name, task in built.tasks["tasks"].items()}
        clean_acc: dict[str, ResultAcc] = {
            name: {"task": task, "raw_metrics": defaultdict(list), "logged_samples": []}
            for name, task in built.tasks["tasks"].items() if clean is not None}
        code_tasks = _run_programs(built, scores, run_programs)
        for name, acc in accumulators.items():
            task = acc["task"]
            for filter_key, index, doc, requests in _filtered_documents(name, task, built, scores):
                CODE_EVAL.last = []
                metrics = task.process_results(doc, [req.filtered_resps[filter_key] for req in requests])
                if log_samples:
                    example = _logged_sample(index, doc, task.doc_to_target(doc), requests, filter_key, metrics)
                    if name in code_tasks:
                        example["programs"] = [r for row in CODE_EVAL.last for r in row]
                    acc["logged_samples"].append(example)
                for metric, value in metrics.items():
                    acc["raw_metrics"][(metric, filter_key)].append(value)
                    if clean is not None and index in clean[name]:
                        clean_acc[name]["raw_metrics"][(metric, filter_key)].append(value)
        groups = built.tasks.get("groups", {})
        processed = _process_results(accumulators, groups, bootstrap_iters)
        out = processed._to_eval_results(samples=processed.samples if log_samples else None)
        if clean is not None:
            _add_decontaminated(out, _process_results(clean_acc, groups, bootstrap_iters)._to_eval_results())
        return out


def seed_langdetect() -> None:
    """IFEval's language checks call langdetect, which draws a new random seed for every text unless
    DetectorFactory.seed is set: lm-eval's own IFEval scores of a short or mixed-language answer can change from
    one run to the next. raylm sets it to 0, a deliberate difference from lm-eval (docs/switching-from-lm-eval.md).
    Without langdetect installed no task calls it."""
    try:
        from langdetect import DetectorFactory
    except ImportError:
        return
    DetectorFactory.seed = 0


def _add_decontaminated(out: dict[str, Any], clean: dict[str, Any]) -> None:
    """The clean pass's metrics into the full pass's results under their `_decontaminate` names, their
    directions beside them, and each task's clean count in n-samples."""
    for section in ("results", "groups"):
        for name, metrics in clean.get(section, {}).items():
            renamed = {decontaminated_key(k): v for k, v in metrics.items() if k not in _NOT_METRICS}
            out[section][name].update(renamed)
            if "sample_count" in metrics:  # a group's documents per metric
                out[section][name].setdefault("sample_count", {}).update(
                    {decontaminated_key(k): v for k, v in metrics["sample_count"].items()})
            if renamed and name in out["higher_is_better"]:
                out["higher_is_better"][name].update({f"{m}{SUFFIX}": h for m, h in
                                                      list(out["higher_is_better"][name].items())
                                                      if not m.endswith(SUFFIX)})
    for name, counts in clean["n-samples"].items():
        out["n-samples"][name]["decontaminate"] = counts["effective"]
