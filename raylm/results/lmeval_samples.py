"""lm-eval's logged samples -> Parquet: one row per request, and one per document and filter.

The document rows carry what lm-eval's --log_samples logs (doc_id, doc, target, arguments, responses: scores, or a
generation task's texts as `resps`, filtered responses, filter, per-document metrics, hashes); the request rows
add raylm's token counts (a generation's prompt and generated tokens). Both are built from
the samples lm-eval itself logged, so the loglikelihoods are exactly the ones its metrics were computed from.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from lm_eval.utils import handle_non_serializable

from raylm.errors import RaylmError

def _as_json(value: Any) -> str:
    return json.dumps(value, default=handle_non_serializable, ensure_ascii=False)


def _score(resp: list) -> tuple[float, bool | None]:
    """A request's first response: (loglikelihood, is_greedy), or a rolling total (no greedy flag)."""
    first = resp[0]
    return (float(first[0]), bool(first[1])) if isinstance(first, (tuple, list)) else (float(first), None)


def _column(values: list[Any]) -> pa.Array:
    """A per-document metric as Arrow infers it (numbers, or lists for lm-eval's tuple-valued metrics), else as
    JSON text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_as_json(v) for v in values], pa.string())


def _arguments(arguments: tuple | list) -> list[str]:
    """A request's arguments as text: strings as they are, a generation's gen_kwargs as JSON."""
    return [a if isinstance(a, str) else _as_json(a) for a in arguments]


def _generated(samples: list[dict[str, Any]]) -> bool:
    """Whether these are a generate_until task's samples: their responses are texts."""
    return any(isinstance(r[0], str) for s in samples for r in s["resps"] if r)


def docs_table(samples: list[dict[str, Any]]) -> pa.Table:
    columns: dict[str, pa.Array] = {
        "doc_id": pa.array([s["doc_id"] for s in samples], pa.int64()),
        "target": pa.array([str(s["target"]) for s in samples], pa.string()),
        "arguments": pa.array([[_arguments(a) for a in s["arguments"]] for s in samples],
                              pa.list_(pa.list_(pa.string()))),
    }
    if _generated(samples):
        columns["resps"] = pa.array([s["resps"] for s in samples], pa.list_(pa.list_(pa.string())))
    else:
        scores = [[_score(r) for r in s["resps"]] for s in samples]
        columns["loglikelihoods"] = pa.array([[ll for ll, _ in doc] for doc in scores], pa.list_(pa.float64()))
        columns["is_greedy"] = pa.array([[g for _, g in doc] for doc in scores], pa.list_(pa.bool_()))
    columns.update({
        "filter": pa.array([s["filter"] for s in samples], pa.string()),
        "filtered_resps": pa.array([_as_json(s["filtered_resps"]) for s in samples], pa.string()),
        "metrics": pa.array([s["metrics"] for s in samples], pa.list_(pa.string())),
    })
    for metric in dict.fromkeys(m for s in samples for m in s["metrics"]):
        columns[metric] = _column([s.get(metric) for s in samples])
    for key in ("doc_hash", "prompt_hash", "target_hash"):
        columns[key] = pa.array([s[key] for s in samples], pa.string())
    columns["doc"] = pa.array([_as_json(s["doc"]) for s in samples], pa.string())
    return pa.table(columns)


def requests_table(task: str, samples: list[dict[str, Any]], scored: pa.Table,
                   indices: list[int] | None = None) -> pa.Table:
    """One row per request (of the first filter's samples: requests are the same under every filter), with the
    tokens raylm scored for it (a rolling request's summed over its windows). With --samples `indices`, a scored
    request's doc_id is its document's position among them, and lm-eval logs the document's own index."""
    if "generation" in scored.column_names:
        return _generation_requests_table(task, samples, scored, indices)
    per_request = scored.group_by(["doc_id", "req_idx"]).aggregate([
        ("context_tokens", "max"), ("continuation_tokens", "sum"), ("window", "count")]).sort_by(
        [("doc_id", "ascending"), ("req_idx", "ascending")])
    tokens = iter(zip(*(per_request[c].to_pylist() for c in ("doc_id", "req_idx", "context_tokens_max",
                                                              "continuation_tokens_sum", "window_count"))))
    first_filter = samples[0]["filter"] if samples else None
    cols: dict[str, list] = {k: [] for k in ("doc_id", "req_idx", "arguments", "loglikelihood", "is_greedy",
                                             "context_tokens", "continuation_tokens", "windows")}
    for sample in (s for s in samples if s["filter"] == first_filter):
        for arguments, resp in zip(sample["arguments"], sample["resps"]):
            doc_id, idx, n_context, n_continuation, windows = next(tokens, (None,) * 5)
            if indices and doc_id is not None:
                doc_id = indices[doc_id]
            if doc_id != sample["doc_id"]:
                raise RaylmError(f"{task}: logged samples and scored requests disagree at doc {sample['doc_id']}")
            loglikelihood, greedy = _score(resp)
            for key, value in (("doc_id", doc_id), ("req_idx", idx), ("arguments", _arguments(arguments)),
                               ("loglikelihood", loglikelihood), ("is_greedy", greedy), ("context_tokens", n_context),
                               ("continuation_tokens", n_continuation), ("windows", windows)):
                cols[key].append(value)
    return pa.table({**cols, "arguments": pa.array(cols["arguments"], pa.list_(pa.string()))}).cast(pa.schema([
        ("doc_id", pa.int64()), ("req_idx", pa.int32()), ("arguments", pa.list_(pa.string())),
        ("loglikelihood", pa.float64()), ("is_greedy", pa.bool_()), ("context_tokens", pa.int32()),
        ("continuation_tokens", pa.int64()), ("windows", pa.int64())]))


def _generation_requests_table(task: str, samples: list[dict[str, Any]], scored: pa.Table,
                               indices: list[int] | None) -> pa.Table:
    """One row per generate_until request: its arguments, its texts in repeat order, its prompt's tokens as the
    model saw them and the tokens generated over all its repeats."""
    per_request = scored.group_by(["doc_id", "req_idx"]).aggregate([
        ("context_tokens", "max"), ("generated_tokens", "sum")]).sort_by(
        [("doc_id", "ascending"), ("req_idx", "ascending")])
    tokens = iter(zip(*(per_request[c].to_pylist() for c in ("doc_id", "req_idx", "context_tokens_max",
                                                              "generated_tokens_sum"))))
    first_filter = samples[0]["filter"] if samples else None
    cols: dict[str, list] = {k: [] for k in ("doc_id", "req_idx", "arguments", "generations", "context_tokens",
                                             "generated_tokens")}
    for sample in (s for s in samples if s["filter"] == first_filter):
        for arguments, resp in zip(sample["arguments"], sample["resps"]):
            doc_id, idx, n_context, n_generated = next(tokens, (None,) * 4)
            if indices and doc_id is not None:
                doc_id = indices[doc_id]
            if doc_id != sample["doc_id"]:
                raise RaylmError(f"{task}: logged samples and generations disagree at doc {sample['doc_id']}")
            for key, value in (("doc_id", doc_id), ("req_idx", idx), ("arguments", _arguments(arguments)),
                               ("generations", list(resp)), ("context_tokens", n_context),
                               ("generated_tokens", n_generated)):
                cols[key].append(value)
    return pa.table(cols, schema=pa.schema([
        ("doc_id", pa.int64()), ("req_idx", pa.int32()), ("arguments", pa.list_(pa.string())),
        ("generations", pa.list_(pa.string())), ("context_tokens", pa.int32()), ("generated_tokens", pa.int64())]))
