"""Documents -> loglikelihood requests in an Arrow table, one row per (context, continuation) pair.

Token ids travel as list<int32> columns so shards are zero-copy Arrow blocks in Ray's object store. The columns
that metrics need ride along (gold and acc_norm lengths for choices; word/byte counts, set on a document's
first window only, for rolling text) so an actor can reduce its shard to sums without any other state. A masked
LM's table has two more columns (raylm.requests.masked): `following`, the tokens after the continuation, and
`word_ids`, each continuation token's word; a table has them exactly when it is meant for a masked-LM scorer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder, MaskedRequest
from raylm.requests.windows import strided_windows
from raylm.errors import RaylmError
from raylm.tasks import ChoiceDoc, Doc, Task, TextDoc

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    ("doc_id", pa.int64()),
    ("req_idx", pa.int32()),
    ("context", pa.list_(pa.int32())),
    ("continuation", pa.list_(pa.int32())),
    ("gold", pa.int32()),
    ("norm_len", pa.int64()),
    ("words", pa.int64()),
    ("bytes", pa.int64()),
])
MASKED_COLUMNS = ("following", "word_ids")


def with_masked_columns(schema: pa.Schema) -> pa.Schema:
    """A request schema with a masked LM's two extra token columns (lm-eval's request tables use it too)."""
    return pa.schema([*schema, *((name, pa.list_(pa.int32())) for name in MASKED_COLUMNS)])


MASKED_SCHEMA = with_masked_columns(SCHEMA)


def build_requests(task: Task, docs: list[Doc], encoder: Encoder | MaskedEncoder) -> pa.Table:
    """All of a task's requests, sorted by (doc_id, req_idx) so shards can be cut on document boundaries."""
    masked = isinstance(encoder, MaskedEncoder)
    cols: dict[str, list] = {name: [] for name in (MASKED_SCHEMA if masked else SCHEMA).names}
    if task.kind == "multiple_choice":
        requests = _choice_requests([d for d in docs if isinstance(d, ChoiceDoc)], encoder, cols)
    else:
        requests = _rolling_requests([d for d in docs if isinstance(d, TextDoc)], encoder, cols)
    problems = [(task.name, doc_id, req_idx, why, len(request_tokens(request)[1]))
                for doc_id, req_idx, request in zip(cols["doc_id"], cols["req_idx"], requests)
                if (why := unscorable(request, encoder.max_length)) is not None]
    if problems:
        raise RaylmError(describe_problems(problems, encoder.max_length))
    warn_truncated(task.name, sum(truncated(r, encoder.max_length) for r in requests), encoder.max_length)
    return pa.table(cols, schema=MASKED_SCHEMA if masked else SCHEMA)


Request = tuple[list[int], list[int]] | MaskedRequest  # (context, continuation) for a causal LM

# Why a request cannot be scored: its continuation encodes to no tokens, or to more than fit; or its context, only
# whitespace, encodes to none (a GPT-2 tokenizer's ""). Native and lm-eval tables and the scorer all ask unscorable.
EMPTY, LONG, NO_CONTEXT = "empty", "long", "no context"
Problem = tuple[str, int, int, str, int]  # (task, doc_id, request index, why, continuation tokens)


def unscorable(request: Request, max_length: int) -> str | None:
    """Why `request` cannot be scored, or None. A causal request's context is left-truncated to fit, but its
    continuation must fit whole and follow at least one context token (HFLM asserts both); a masked request's
    context is already cut to fit (and never empty), and its continuation must fit with the special tokens."""
    context, continuation = request_tokens(request)
    if not continuation:
        return EMPTY
    if (request.length if isinstance(request, MaskedRequest) else len(continuation)) > max_length:
        return LONG
    return None if context else NO_CONTEXT


def describe_problems(problems: list[Problem], max_length: int) -> str:
    """One line for every unscorable request of every task, grouped by task."""
    by_task: dict[str, list[Problem]] = {}
    for problem in problems:
        by_task.setdefault(problem[0], []).append(problem)
    parts = []
    for task, mine in by_task.items():
        long = [f"doc {d} request {i} ({n} tokens)" for _, d, i, why, n in mine if why == LONG]
        empty = [f"doc {d} request {i}" for _, d, i, why, _ in mine if why == EMPTY]
        no_context = [f"doc {d} request {i}" for _, d, i, why, _ in mine if why == NO_CONTEXT]
        if long:
            parts.append(f"{task}: {len(long)} continuation(s) longer than the model's {max_length}-token context, "
                         f"which lm-eval cannot score either: {', '.join(long)}")
        if empty:
            parts.append(f"{task}: {len(empty)} continuation(s) encode to no tokens: {', '.join(empty)}")
        if no_context:
            parts.append(f"{task}: {len(no_context)} context(s) of only whitespace encode to no tokens, which "
                         f"lm-eval cannot score either (HFLM asserts a non-empty context): {', '.join(no_context)}")
    return "; ".join(parts)


def truncated(request: Request, max_length: int) -> bool:
    """Whether the scorer left-truncates the request's context to fit (lm-eval's HFLM cuts the joint encoding to
    its last max_length + 1 tokens, of which the last is never fed); a masked request's was cut already."""
    if isinstance(request, MaskedRequest):
        return request.dropped > 0
    context, continuation = request
    return len(context) + len(continuation) > max_length + 1


def warn_truncated(task: str, count: int, max_length: int) -> None:
    """One line per task, native and lm-eval alike, where HFLM warns once per request."""
    if count:
        log.warning("%s: %d requests exceed the model's max length %d; their contexts are left-truncated", task,
                    count, max_length)


def request_tokens(request: Request) -> tuple[Sequence[int], Sequence[int]]:
    """(context, continuation) of a causal or a masked request."""
    return (request.context, request.continuation) if isinstance(request, MaskedRequest) else request


def rolling_windows(encoder: Encoder | MaskedEncoder, texts: list[str]) -> list[list[Request]]:
    """Each text's windows for loglikelihood_rolling: lm-eval's (stride = max length, conditioned on the prefix
    token) for a causal LM, the MaskedEncoder's own, scoring each token once, for a masked LM."""
    if isinstance(encoder, MaskedEncoder):
        return encoder.document_windows(texts)
    return [strided_windows(tokens, encoder.prefix_token, encoder.max_length, encoder.max_length)
            for tokens in encoder.encode_many(texts)]


def _choice_requests(docs: list[ChoiceDoc], encoder: Encoder | MaskedEncoder, cols: dict[str, list]
                     ) -> list[Request]:
    pairs = [(c, k) for d in docs for c, k in zip(d.contexts, d.continuations)]
    requests = encoder.encode_pairs(pairs)
    encoded = iter(requests)
    for doc in docs:
        for req_idx, norm_len in enumerate(doc.norm_lengths):
            _append(cols, doc.doc_id, req_idx, next(encoded), doc.gold, norm_len, 0, 0)
    return requests


def _rolling_requests(docs: list[TextDoc], encoder: Encoder | MaskedEncoder, cols: dict[str, list]
                      ) -> list[Request]:
    requests: list[Request] = []
    for doc, windows in zip(docs, rolling_windows(encoder, [d.text for d in docs])):
        for req_idx, request in enumerate(windows):
            first = req_idx == 0
            _append(cols, doc.doc_id, req_idx, request, -1, 0, doc.words if first else 0, doc.bytes if first else 0)
        requests += windows
    return requests


def _append(cols: dict[str, list], doc_id: int, req_idx: int, request: Request, gold: int, norm_len: int,
            words: int, n_bytes: int) -> None:
    if isinstance(request, MaskedRequest):
        cols["following"].append(request.following)
        cols["word_ids"].append(request.word_ids)
    context, continuation = request_tokens(request)
    for name, value in (("doc_id", doc_id), ("req_idx", req_idx), ("context", context),
                        ("continuation", continuation), ("gold", gold), ("norm_len", norm_len),
                        ("words", words), ("bytes", n_bytes)):
        cols[name].append(value)


def forward_tokens(table: pa.Table) -> int:
    """The tokens a scorer runs its model over for these requests, before prefix sharing and truncation (which only
    lower it): a causal LM one pass over context + continuation; a masked LM one copy of the whole request per
    continuation token, each with that token masked (raylm.scoring.mlm); a generation its prompt and at most
    max_gen_toks new tokens."""
    def length(column: str):
        return pc.list_value_length(table[column]).fill_null(0)

    if "continuation" not in table.column_names:  # a generation table: its prompt, then at most max_gen_toks steps
        return int(pc.sum(pc.add(length("context"), table["max_gen_toks"])).as_py() or 0)
    lengths = pc.add(length("context"), length("continuation"))
    if "following" in table.column_names:
        lengths = pc.multiply(pc.add(lengths, length("following")), length("continuation"))
    return int(pc.sum(lengths).as_py() or 0)
