"""Documents -> loglikelihood requests in an Arrow table, one row per (context, continuation) pair.

Token ids travel as list<int32> columns so shards are zero-copy Arrow blocks in Ray's object store. The columns
that metrics need ride along (gold and acc_norm lengths for choices; word/byte counts, set on a document's
first window only, for rolling text) so an actor can reduce its shard to sums without any other state.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from raylm.requests.encoding import Encoder
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


def build_requests(task: Task, docs: list[Doc], encoder: Encoder) -> pa.Table:
    """All of a task's requests, sorted by (doc_id, req_idx) so shards can be cut on document boundaries."""
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    if task.kind == "multiple_choice":
        _choice_requests([d for d in docs if isinstance(d, ChoiceDoc)], encoder, cols)
    else:
        _rolling_requests([d for d in docs if isinstance(d, TextDoc)], encoder, cols)
    _check_lengths(task, cols, encoder.max_length)
    return pa.table(cols, schema=SCHEMA)


def _choice_requests(docs: list[ChoiceDoc], encoder: Encoder, cols: dict[str, list]) -> None:
    pairs = [(c, k) for d in docs for c, k in zip(d.contexts, d.continuations)]
    encoded = iter(encoder.encode_pairs(pairs))
    for doc in docs:
        for req_idx, norm_len in enumerate(doc.norm_lengths):
            context, continuation = next(encoded)
            _append(cols, doc.doc_id, req_idx, context, continuation, doc.gold, norm_len, 0, 0)


def _rolling_requests(docs: list[TextDoc], encoder: Encoder, cols: dict[str, list]) -> None:
    for doc, tokens in zip(docs, encoder.encode_many([d.text for d in docs])):
        windows = strided_windows(tokens, encoder.prefix_token, encoder.max_length, encoder.max_length)
        for req_idx, (context, continuation) in enumerate(windows):
            first = req_idx == 0
            _append(cols, doc.doc_id, req_idx, context, continuation, -1, 0,
                    doc.words if first else 0, doc.bytes if first else 0)


def _append(cols: dict[str, list], doc_id: int, req_idx: int, context: list[int], continuation: list[int],
            gold: int, norm_len: int, words: int, n_bytes: int) -> None:
    for name, value in (("doc_id", doc_id), ("req_idx", req_idx), ("context", context),
                        ("continuation", continuation), ("gold", gold), ("norm_len", norm_len),
                        ("words", words), ("bytes", n_bytes)):
        cols[name].append(value)


def _check_lengths(task: Task, cols: dict[str, list], max_length: int) -> None:
    """Long contexts are left-truncated by the scorer (as lm-eval does); over-long continuations cannot be scored."""
    truncated = 0
    for doc_id, context, continuation in zip(cols["doc_id"], cols["context"], cols["continuation"]):
        if not continuation:
            raise RaylmError(f"{task.name}: doc {doc_id}: the continuation encodes to no tokens")
        if len(continuation) > max_length:
            raise RaylmError(f"{task.name}: doc {doc_id}: continuation of {len(continuation)} tokens exceeds "
                             f"the model's max length {max_length}")
        truncated += len(context) + len(continuation) > max_length + 1
    if truncated:
        log.warning("%s: %d requests exceed the model's max length %d; their contexts are left-truncated",
                    task.name, truncated, max_length)
