"""Final results -> results.json (lm-eval's shape), per-request samples as Parquet, and a printed table.

results.json has lm-eval's full shape for native and lm-eval tasks alike (results, groups, group_subtasks,
configs, versions, n-shot, higher_is_better, n-samples, config), so lm-eval's own tools read it
(`lm_eval.utils.make_table` prints it); raylm's extras sit under keys lm-eval ignores (`sums`,
`token_perplexity`, and `config`'s wall time, shards, versions and the rest).
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import pyarrow as pa

import raylm
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.models.chat import template_sha
from raylm.models.spec import ModelSpec
from raylm.requests.shards import LMEVAL_KIND
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.metrics import token_perplexity
from raylm.results.native import lmeval_shape
from raylm.results.sample_logs import date_id, write_sample_logs
from raylm.scoring.predictions import choice_predictions
from raylm.storage.atomic import write_atomic, write_parquet_atomic
from raylm.storage.location import Location, location
from raylm.storage.ownership import tagged

log = logging.getLogger(__name__)

VERSIONED = ("ray", "torch", "transformers")  # installed distributions whose versions decide a run's numbers


def run_config(model: ModelSpec, wall_s: float, **fields: object) -> dict[str, Any]:
    """The `config` every raylm results.json carries: the model, what the run was asked, its wall time, and the
    versions of what computed it."""
    versions = {"raylm": raylm.__version__, **{name: metadata.version(name) for name in VERSIONED},
                "python": platform.python_version()}
    # lm-eval's model_args are strings and numbers: settings left at None are left out.
    model_args = {key: value for key, value in model.as_dict().items() if value is not None}
    return {"model": model.path, "model_args": model_args, **fields, "wall_time_s": wall_s,
            "versions": versions}


def results_dict(result: EvalResult) -> dict[str, Any]:
    cfg = result.config
    ours = lmeval_shape({n: t for n, t in result.tasks.items() if t.kind != LMEVAL_KIND}, cfg)
    theirs = result.lmeval or {}

    def merged(key: str, by_name: bool = False) -> dict[str, Any]:
        """Sorted by name (as lm-eval sorts these), or in the order the tasks were asked for: each native task in
        its place, lm-eval's block (its tasks, then its groups) where the first lm-eval name was."""
        if by_name:
            return dict(sorted({**ours.get(key, {}), **theirs.get(key, {})}.items()))
        out: dict[str, Any] = {}
        for name in cfg.tasks:
            out.update({name: ours[key][name]} if name in ours.get(key, {}) else theirs.get(key, {}))
        return out

    return {
        "results": merged("results"),
        **({"groups": theirs["groups"]} if theirs.get("groups") else {}),
        "group_subtasks": theirs.get("group_subtasks", {}),
        "configs": merged("configs", by_name=True),  # sorted, as lm-eval writes these four
        "versions": merged("versions", by_name=True),
        "n-shot": merged("n-shot", by_name=True),
        "higher_is_better": merged("higher_is_better", by_name=True),
        "n-samples": merged("n-samples"),
        "config": run_config(
            cfg.model, result.wall_s, dtype=cfg.model.dtype, quantization=cfg.model.quantization,
            num_gpus=cfg.num_gpus, num_cpus=cfg.num_cpus, tasks=list(cfg.tasks), limit=cfg.limit,
            num_fewshot=cfg.num_fewshot, batch_size=cfg.batch_size or "auto", actors=cfg.actors,
            data_dir=str(cfg.data_dir or "hub"), include_path=str(cfg.include_path) if cfg.include_path else None,
            bootstrap_iters=cfg.bootstrap_iters, random_seed=cfg.random_seed, numpy_seed=cfg.numpy_seed,
            torch_seed=cfg.torch_seed, fewshot_seed=cfg.fewshot_seed, samples=cfg.samples, metadata=cfg.metadata,
            apply_chat_template=cfg.apply_chat_template, chat_template_args=cfg.chat_template_args,
            gen_kwargs=cfg.gen_kwargs, **thinking_record(cfg),
            **{k: v for k, v in result.extra.items() if k != "chat_template"}),
        **prompt_record(cfg, result.extra.get("chat_template")),
        **({"decontamination": result.decontamination} if result.decontamination is not None else {}),
        "sums": {name: t.sums for name, t in result.tasks.items()},
        "token_perplexity": {name: token_perplexity(t.sums) for name, t in result.tasks.items()
                             if _is_rolling(result, name)},
    }


def thinking_record(cfg: EvalConfig) -> dict[str, Any]:
    """HFLM's enable_thinking and think_end_token where a run sets them (think_end_token changes what every
    generation task scores, and nothing else in results.json would say so)."""
    return {key: value for key, value in (("enable_thinking", cfg.enable_thinking),
                                          ("think_end_token", cfg.think_end_token)) if value is not None}


def prompt_record(cfg: EvalConfig, chat_template: str | None) -> dict[str, Any]:
    """The prompt settings at the top level of results.json, under lm-eval's keys and with its hashes
    (EvaluationTracker's general config): the template source the prompts were rendered with, or None."""
    return {
        "system_instruction": cfg.system_instruction,
        "system_instruction_sha": template_sha(cfg.system_instruction) if cfg.system_instruction else None,
        "fewshot_as_multiturn": cfg.multiturn,
        "chat_template": chat_template,
        "chat_template_sha": template_sha(chat_template) if chat_template else None,
    }


def prefix_sharing(verdicts: Iterable[str | None]) -> str | list[str] | None:
    """config.prefix_sharing from the actors' verdicts on sharing prefixes between requests
    (raylm.scoring.attention), each logged once: one string, or a list where actors disagreed (each start-up
    checks its own first shard or batch); None if no actor said (every shard resumed from an older checkpoint)."""
    distinct = sorted({v for v in verdicts if v is not None})
    for verdict in distinct:
        fell_back = verdict.startswith("unpacked (start-up check")
        log.log(logging.WARNING if fell_back else logging.INFO, "prefix sharing: %s", verdict)
    return distinct[0] if len(distinct) == 1 else distinct or None


def _is_rolling(result: EvalResult, name: str) -> bool:
    kind = result.tasks[name].kind
    if kind == LMEVAL_KIND:
        return result.lmeval["configs"][name].get("output_type") == "loglikelihood_rolling"
    return kind == "rolling"


def token_counts(shards: Iterable[tuple[str, int | None, int | None]]) -> dict[str, dict[str, int]]:
    """config.tokens: per task, the tokens its requests hold (scoring each alone would compute them) and the tokens
    the actors computed, from (task, tokens in requests, computed tokens) per shard; tasks whose shards do not say (a
    masked LM's) are left out."""
    out: dict[str, dict[str, int]] = {}
    known: dict[str, bool] = {}
    for task, in_requests, computed in shards:
        counts = out.setdefault(task, {"in_requests": 0, "computed": 0})
        known[task] = known.get(task, True) and in_requests is not None and computed is not None
        if known[task]:
            counts["in_requests"] += in_requests
            counts["computed"] += computed
    return {task: counts for task, counts in out.items() if known[task]}


def run_summary(extra: dict[str, object], wall_s: float) -> str:
    """The final line: what was scored here, what had to be retried, what came from a checkpoint, and what share
    of the requests' tokens the actors computed."""
    tokens = extra.get("tokens") or {}
    held = sum(t["in_requests"] for t in tokens.values())
    computed = sum(t["computed"] for t in tokens.values())
    share = f"{computed} of the requests' {held} tokens computed ({computed / held:.3f}), " if held else ""
    return (f"{extra['requests_scored']} requests scored in {extra['shards']} shards, "
            f"{extra['shards_retried']} retried, {extra['shards_resumed']} resumed from checkpoint, "
            f"{share}wall time {wall_s:.1f} s")


def write_samples(out_dir: str | os.PathLike[str] | Location, result: EvalResult, sample_logs: bool = True) -> None:
    """samples/<task>.parquet per request; samples/<task>_docs.parquet per document for multiple choice and, with
    lm-eval's logged samples, for every lm-eval task; unless `sample_logs` is off (--output_path writes them in
    lm-eval's own layout: raylm.results.lmeval_output), every task's logged samples also as lm-eval's own
    samples/samples_<task>_<date>.jsonl (raylm.results.sample_logs); each file written atomically."""
    out_dir = location(out_dir)
    for name, task in result.tasks.items():
        path = out_dir / "samples" / f"{name}.parquet"
        if task.kind == LMEVAL_KIND:
            _write_lmeval_samples(path, result, name)
            continue
        write_parquet_atomic(path, tagged(_with_hashes(task.scored, task)))
        if task.kind == "multiple_choice":
            p = choice_predictions(task.scored)
            docs = pa.table({"doc_id": p.doc_id, "gold": p.gold, "pred": p.pred, "pred_norm": p.pred_norm,
                             "acc": (p.pred == p.gold).astype("int8"),
                             "acc_norm": (p.pred_norm == p.gold).astype("int8")})
            write_parquet_atomic(out_dir / "samples" / f"{name}_docs.parquet",
                                 tagged(_with_hashes(docs, task)))
    logged = logged_samples(result)
    if logged and sample_logs:
        write_sample_logs(out_dir / "samples", logged, date_id())


def logged_samples(result: EvalResult) -> dict[str, list[dict[str, Any]]]:
    """Every task's samples as lm-eval logs them (a native task's where lm-eval logged them:
    raylm.results.native_logs), by task."""
    return {name: result.lmeval["samples"][name] if task.kind == LMEVAL_KIND else task.samples
            for name, task in result.tasks.items() if task.kind == LMEVAL_KIND or task.samples is not None}


def _with_hashes(table: pa.Table, task: TaskResult) -> pa.Table:
    """A native task's rows with their document's hashes, which raylm compare pairs documents by: lm-eval's
    `doc_hash` (where lm-eval logged the task's samples), which its own runs log too, and raylm's `row_hash`."""
    doc_ids = table["doc_id"].to_pylist()
    for column, hashes in (("doc_hash", task.doc_hashes), ("row_hash", task.row_hashes)):
        if hashes is not None:
            table = table.append_column(column, pa.array([hashes[d] for d in doc_ids], pa.string()))
    return table


def _write_lmeval_samples(path: Location, result: EvalResult, name: str) -> None:
    from raylm.results.lmeval_samples import docs_table, requests_table

    samples = (result.lmeval or {}).get("samples")
    if samples is None:
        raise RaylmError(f"{name}: lm-eval's samples were not kept (run with log_samples)")
    indices = (result.config.samples or {}).get(name)
    write_parquet_atomic(path, tagged(requests_table(name, samples[name], result.tasks[name].scored, indices)))
    write_parquet_atomic(path.parent / f"{name}_docs.parquet", tagged(docs_table(samples[name])))


def results_json(result: EvalResult) -> str:
    """The results.json text; lm-eval's configs hold values only its own serialiser knows (numpy scalars, sets)."""
    if result.lmeval is not None:
        from lm_eval.utils import handle_non_serializable

        return json.dumps(results_dict(result), indent=2, default=handle_non_serializable, ensure_ascii=False)
    return json.dumps(results_dict(result), indent=2, default=str)


def write_results(out_dir: str | os.PathLike[str] | Location, result: EvalResult) -> Location:
    path = location(out_dir) / "results.json"
    write_atomic(path, results_json(result).encode())
    return path


def format_table(result: EvalResult) -> str:
    """lm-eval's own tables (make_table: tasks, then groups with their subtasks indented), or raylm's plain one
    where lm-eval is not installed; then the run's summary line."""
    try:
        from lm_eval.utils import make_table
    except ImportError:
        return _plain_table(result)
    shown = results_dict(result)
    tables = [make_table(shown)] + ([make_table(shown, "groups")] if "groups" in shown else [])
    return "\n".join([*tables, run_summary(result.extra, result.wall_s)])


def _plain_table(result: EvalResult) -> str:
    lines = [f"{'task':<12} {'metric':<18} {'value':>14} {'stderr':>10}  n"]
    for name, task in result.tasks.items():
        for key, value in task.metrics.items():
            if "_stderr" in key:
                continue
            metric = key.split(",")[0]
            stderr = task.metrics.get(f"{metric}_stderr,none")
            stderr_text = f"{stderr:10.4f}" if stderr is not None else f"{'':>10}"
            lines.append(f"{name:<12} {metric:<18} {value:14.4f} {stderr_text}  {int(task.sums['docs'])}")
    lines.append(run_summary(result.extra, result.wall_s))
    return "\n".join(lines)
