"""lm-eval's requests -> Arrow request tables, tokenised as HFLM tokenises them.

A (context, continuation) pair goes through raylm's Encoder (HFLM's `_encode_pair` rules, empty contexts
included); a rolling text becomes the rolling windows HFLM scores (stride = max length), one row per window, the
document's score being the sum over its windows. Rows keep lm-eval's (doc_id, idx) so scores go back to the
Instance they came from, and a `window` column numbering a rolling request's windows. A generate_until task's
requests become a generation table instead (raylm.requests.generation). For a masked LM the
MaskedEncoder builds the same requests as for the native tasks (its own windows for rolling texts), with their
`following` and `word_ids` columns.

The schema metadata names the task, its version and a digest of its whole config (prompt templates, metrics,
filters, few-shot settings), so the checkpoint fingerprint, which hashes the tables, changes with any of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from lm_eval.utils import handle_non_serializable

from raylm.errors import RaylmError
from raylm.requests.cache import TableCache
from raylm.requests.encoding import Encoder
from raylm.requests.generation import ModelSampling, generation_table
from raylm.requests.masked import MaskedEncoder, MaskedRequest
from raylm.requests.native import Tables
from raylm.requests.shards import LMEVAL_KIND
from raylm.requests.table import (
    describe_problems,
    request_tokens,
    rolling_windows,
    truncated,
    unscorable,
    warn_truncated,
    with_masked_columns,
)
from raylm.tasks.lmeval.build import Built, Request, load_and_build
from raylm.tasks.lmeval.names import Selection
from raylm.tasks.lmeval.selection import refuse_native_clash
from raylm.tasks.prompt import PLAIN, PromptFormat

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    ("doc_id", pa.int64()),
    ("req_idx", pa.int32()),
    ("window", pa.int32()),
    ("context", pa.list_(pa.int32())),
    ("continuation", pa.list_(pa.int32())),
])
MASKED_SCHEMA = with_masked_columns(SCHEMA)


def request_table(requests: list[Request], encoder: Encoder | MaskedEncoder,
                  metadata: dict[bytes, bytes] | None = None, cache: TableCache | None = None
                  ) -> tuple[pa.Table, list[tuple[Request, str, int]]]:
    """Requests as rows, in the order given, and every request raylm cannot score, why, and its continuation's
    token count: none (nothing to score), more than the model's context (HFLM stops on these with a bare
    AssertionError; for a masked LM, more than fits with its special tokens), or a context encoded to no token
    (HFLM asserts on these too). Requests whose contexts will be left-truncated are counted per task in one
    warning line, as for native tasks. With a cache (one task's requests), the table is read from it where it is
    kept, else kept there unless some request is unscorable."""
    cache = cache if requests and metadata is not None else None
    kept = cache.get(requests, metadata) if cache is not None else None
    if kept is not None:
        table, problems, cut = kept[0], [], Counter({requests[0].task: kept[1]})
    else:
        table, problems, cut = _rows(requests, encoder, metadata)
    for task, count in cut.items():
        warn_truncated(task, count, encoder.max_length)
    if cache is not None and kept is None and not problems:
        try:
            cache.put(requests, metadata, table, sum(cut.values()))
        except OSError as e:
            log.warning("could not keep %s's request table in %s (%s); the next run will build it again",
                        requests[0].task, cache.directory, e.strerror or e)
    return table, problems


def _rows(requests: list[Request], encoder: Encoder | MaskedEncoder, metadata: dict[bytes, bytes] | None
          ) -> tuple[pa.Table, list[tuple[Request, str, int]], Counter[str]]:
    """request_table's table and problems, and each task's count of left-truncated requests, unwarned."""
    masked = isinstance(encoder, MaskedEncoder)
    schema = MASKED_SCHEMA if masked else SCHEMA
    cols: dict[str, list] = {name: [] for name in schema.names}
    pairs = [r for r in requests if r.request_type != "loglikelihood_rolling"]
    encoded = iter(encoder.encode_pairs([r.arguments for r in pairs]))
    windowed = iter(rolling_windows(encoder, [r.arguments[0] for r in requests
                                              if r.request_type == "loglikelihood_rolling"]))
    problems = []
    cut: Counter[str] = Counter()
    for request in requests:
        if request.request_type == "loglikelihood_rolling":
            windows = next(windowed)
        else:
            windows = [next(encoded)]
            why = unscorable(windows[0], encoder.max_length)
            if why is not None:
                problems.append((request, why, len(request_tokens(windows[0])[1])))
            cut[request.task] += truncated(windows[0], encoder.max_length)
        for window, item in enumerate(windows):
            context, continuation = request_tokens(item)
            for name, value in (("doc_id", request.doc_id), ("req_idx", request.idx), ("window", window),
                                ("context", context), ("continuation", continuation)):
                cols[name].append(value)
            if isinstance(item, MaskedRequest):
                cols["following"].append(item.following)
                cols["word_ids"].append(item.word_ids)
    return pa.table(cols, schema=schema.with_metadata(metadata)), problems, cut


def task_metadata(built: Built, task: str) -> dict[bytes, bytes]:
    """What identifies a task's requests besides their tokens: its name, version and whole config."""
    obj = built.tasks["tasks"][task]
    config = json.dumps(obj.dump_config(), sort_keys=True, default=handle_non_serializable)
    return {b"raylm.lmeval.task": task.encode(), b"raylm.lmeval.version": str(obj.VERSION).encode(),
            b"raylm.lmeval.config": hashlib.sha256(config.encode()).hexdigest().encode()}


def request_tables(built: Built, encoder: Encoder | MaskedEncoder,
                   sampling: Callable[[], ModelSampling] = ModelSampling, seed: int | None = None,
                   cache: TableCache | None = None,
                   on_table: Callable[[str, pa.Table], None] | None = None) -> dict[str, pa.Table]:
    """Every task's table, or one line naming every unscorable request of every task. A generate_until task's is a
    generation table (raylm.requests.generation), from the model's sampling defaults (`sampling`, asked for only
    when a task generates) and the run's torch seed; any other task's is read from `cache` where it keeps it.
    `on_table(task, table)` is handed each task's table as soon as it is built, unless it holds a request raylm
    cannot score (the run stops on those once every task is built)."""
    tables, problems = {}, []
    model: ModelSampling | None = None
    for task in built.tasks["tasks"]:
        metadata = task_metadata(built, task)
        if built.output_type(task) == "generate_until":
            if isinstance(encoder, MaskedEncoder):
                raise RaylmError(f"{task} generates text; a masked LM is scored by pseudo-log-likelihood and cannot "
                                 "generate")
            model = model or sampling()
            tables[task], cut = generation_table(built.requests(task), encoder, model, seed, metadata)
            warn_truncated(task, cut, encoder.max_length)
            unscorable = []
        else:
            tables[task], unscorable = request_table(built.requests(task), encoder, metadata, cache)
            problems += [(r.task, r.doc_id, r.idx, why, n) for r, why, n in unscorable]
        if on_table is not None and not unscorable:
            on_table(task, tables[task])
    if problems:
        raise RaylmError(describe_problems(problems, encoder.max_length))
    return tables


def build_lmeval_requests(selection: Selection, encoder: Encoder | MaskedEncoder, prompt: PromptFormat = PLAIN, *,
                          tasks: Sequence[str], seeds: Sequence[int | None], num_fewshot: int | None = None,
                          limit: int | float | None = None, samples: dict[str, list[int]] | None = None,
                          gen_kwargs: dict[str, Any] | None = None,
                          sampling: Callable[[], ModelSampling] = ModelSampling, predict_only: bool = False,
                          cache: TableCache | None = None,
                          on_table: Callable[[str, pa.Table], None] | None = None) -> tuple[Built, Tables]:
    """lm-eval's tasks loaded, their requests built in lm-eval's order and seeding, and tokenised into tables (or
    read from `cache`). `tasks` is every name the run asks for, native ones too (a built task that clashes with one
    is refused); the keywords are EvalConfig's, and `sampling` the model's generation defaults
    (raylm.requests.driver); `on_table` as for request_tables."""
    built = load_and_build(selection, seeds, num_fewshot, limit, samples, prompt, gen_kwargs, predict_only)
    refuse_native_clash(tasks, built.tasks["tasks"])
    tables = request_tables(built, encoder, sampling, seeds[2], cache, on_table)
    return built, {name: (LMEVAL_KIND, table) for name, table in tables.items()}
