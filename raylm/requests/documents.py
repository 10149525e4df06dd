"""A batch of corpus documents (Arrow rows with `text`, `path` and maybe `domain`) -> every document's strided
windows as requests, and the per-document counts the perplexities divide by.

Plain Python over Arrow: the corpus commands' Ray Data actors and a sweep's resident scoring actors both turn
document batches into windows here, so a corpus scored either way is windowed the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute

from raylm.errors import InputError
from raylm.requests.encoding import Encoder
from raylm.requests.windows import split_conditioning, strided_windows


def document_texts(batch: pa.Table) -> list[str]:
    """A batch's texts, refusing a row whose text is not a string (a null, a number) with its file and field."""
    texts = batch["text"].to_pylist()
    for path, text in zip(batch["path"].to_pylist(), texts):
        if not isinstance(text, str):
            raise InputError(path, f"expected a document's text, got {type(text).__name__}", field="text")
    return texts


def document_domains(batch: pa.Table) -> pa.Array:
    """A batch's `domain` column as strings, refusing a row without one (a null) with its file and field."""
    domains = batch["domain"]
    try:
        domains = pa.compute.cast(domains, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InputError(batch["path"][0].as_py(), f"a domain must be a string or a number, got {domains.type}",
                         field="domain") from e
    if domains.null_count:
        first = domains.is_null().to_pylist().index(True)
        raise InputError(batch["path"][first].as_py(), "a document without a domain (null)", field="domain")
    return domains.combine_chunks() if isinstance(domains, pa.ChunkedArray) else domains


@dataclass
class WindowedDocs:
    """Every window of a batch of documents, flat, with the document each came from (`owner`)."""

    texts: list[str]
    tokens: list[int]
    contexts: list[list[int]]
    continuations: list[list[int]]
    owner: np.ndarray

    def per_doc(self, values: np.ndarray) -> list[float]:
        """Sum per-window values into their documents, exactly rounded."""
        parts: list[list[float]] = [[] for _ in self.texts]
        for doc, value in zip(self.owner.tolist(), values.tolist()):
            parts[doc].append(value)
        return [math.fsum(p) for p in parts]

    def counts(self, batch: pa.Table) -> dict[str, pa.Array]:
        """What the per-unit perplexities divide by: whitespace words, UTF-8 bytes, characters of each text; and
        each document's file and domain (--domain-column), which group them."""
        return {
            "path": batch["path"],
            **({"domain": document_domains(batch)} if "domain" in batch.column_names else {}),
            "tokens": pa.array(self.tokens, pa.int64()),
            "words": pa.array([len(t.split()) for t in self.texts], pa.int64()),
            "bytes": pa.array([len(t.encode("utf-8")) for t in self.texts], pa.int64()),
            "chars": pa.array([len(t) for t in self.texts], pa.int64()),
        }


def window_documents(batch: pa.Table, encoder: Encoder, stride: int) -> WindowedDocs:
    """Every document's strided windows. Documents are encoded by the tokenizer itself, not by the Encoder's
    lm-eval rule (which the WikiText task keeps): a Llama tokenizer's BOS then conditions each document instead
    of being scored after a second BOS and counted as a token (see split_conditioning)."""
    texts = document_texts(batch)
    contexts, continuations, owner, tokens = [], [], [], []
    encoded = encoder.tokenizer(texts)["input_ids"] if texts else []
    for doc, ids in enumerate(encoded):
        first, scored = split_conditioning(list(ids), encoder.prefix_token)
        tokens.append(len(scored))
        for context, continuation in strided_windows(scored, first, encoder.max_length, stride):
            contexts.append(context)
            continuations.append(continuation)
            owner.append(doc)
    return WindowedDocs(texts, tokens, contexts, continuations, np.array(owner, dtype=np.int64))
