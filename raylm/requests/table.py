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
    if masked:
        _check_masked_lengths(task, cols["doc_id"], requests, encoder.max_length)
    else:
        _check_lengths(task, cols, encoder.max_length)
    warn_truncated(task.name, sum(truncated(r, encoder.max_length) for r in requests), encoder.max_length)
    return pa.table(cols, schema=MASKED_SCHEMA if masked else SCHEMA)


Request = tuple[list[int], list[int]] | MaskedRequest  # (context, continuation) for a causal LM


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


def _check_masked_lengths(task: Task, doc_ids: list[int], requests: list[MaskedRequest], max_length: int) -> None:
    """A masked request's context is already cut to fit (raylm.requests.masked); what still does not fit is a
    continuation too long for the model's max length with its special tokens."""
    for doc_id, request in zip(doc_ids, requests):
        if not request.continuation:
            raise RaylmError(f"{task.name}: doc {doc_id}: the continuation encodes to no tokens")
        if request.length > max_length:
            raise RaylmError(f"{task.name}: doc {doc_id}: continuation of {len(request.continuation)} tokens does "
                             f"not fit the model's max length {max_length} with its special tokens")


def _check_lengths(task: Task, cols: dict[str, list], max_length: int) -> None:
    """Long contexts are left-truncated by the scorer (as lm-eval does); over-long continuations cannot be scored."""
    for doc_id, context, continuation in zip(cols["doc_id"], cols["context"], cols["continuation"]):
        if not context:
            raise RaylmError(f"{task.name}: doc {doc_id}: the context is only whitespace and encodes to no tokens, "
                             "which lm-eval cannot score either")
        if not continuation:
            raise RaylmError(f"{task.name}: doc {doc_id}: the continuation encodes to no tokens")
        if len(continuation) > max_length:
            raise RaylmError(f"{task.name}: doc {doc_id}: continuation of {len(continuation)} tokens exceeds "
                             f"the model's max length {max_length}")
