"""Tokenised request tables kept between runs, keyed by what they are made of, never by a name.

An lm-eval task's table is a function of its requests' text (which lm-eval renders from the task's templates, data,
few-shot settings, system instruction and chat template), the task's config digest (the table's metadata), the
tokenizer's content, the encoder's settings, the tokenizer libraries' versions and raylm's code. The key hashes all
of them, so the next model of a sweep with the same tokenizer, a rerun with more tasks or a resumed run reads the
table back instead of tokenising again, and a change to any of them is a miss. lm-eval still builds its requests on
every run: its Instances carry the scores into lm-eval's own metrics.

An entry is an Arrow IPC file followed by its SHA-256, written atomically (raylm.storage.atomic): a truncated or
damaged one fails its digest and is rebuilt with a one-line warning, never read. A tokenizer that cannot be keyed by
its content (a slow, pure-Python one) is not cached. The directory is raylm.cache's, under `requests/`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

import pyarrow as pa

from raylm.cache import cache_dir
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.storage.atomic import write_atomic
from raylm.tasks.lmeval.build import Request

log = logging.getLogger(__name__)

_TRUNCATED_KEY = b"raylm.cache.truncated"  # kept in the entry only, so a hit warns as the build did
_DIGEST_BYTES = 32


def encoder_identity(encoder: Encoder | MaskedEncoder) -> str | None:
    """The tokenizer by its content (the fast tokenizer's whole JSON: vocabulary, merges, normalizer, pre- and
    post-processor; its special tokens and init settings) and the encoder's own settings; None for a tokenizer
    without that JSON."""
    tokenizer = encoder.tokenizer
    if not getattr(tokenizer, "is_fast", False):
        return None
    settings = {"encoder": type(encoder).__name__, "tokenizer": type(tokenizer).__name__,
                "special": tokenizer.special_tokens_map, "added": sorted(tokenizer.get_added_vocab().items()),
                "init": {k: v for k, v in tokenizer.init_kwargs.items() if isinstance(v, (str, int, float, bool))},
                "settings": {k: v for k, v in vars(encoder).items() if k != "tokenizer"},
                "versions": [package_metadata.version(p) for p in ("transformers", "tokenizers")]}
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    digest.update(json.dumps(settings, sort_keys=True, default=_sorted).encode())
    return digest.hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} in an encoder's settings cannot be keyed")


class TableCache:
    """Request tables under `directory`, for one encoder and one version of raylm's code."""

    def __init__(self, directory: Path, identity: str):
        self.directory = directory
        self.identity = identity

    @classmethod
    def for_encoder(cls, encoder: Encoder | MaskedEncoder, code_version: str) -> TableCache | None:
        """The cache under raylm's cache directory; None where it is turned off or the tokenizer cannot be keyed."""
        directory, identity = cache_dir(), encoder_identity(encoder)
        if directory is None or identity is None:
            return None
        return cls(directory / "requests", hashlib.sha256(f"{identity}\0{code_version}".encode()).hexdigest())

    def path(self, requests: Sequence[Request], metadata: dict[bytes, bytes]) -> Path:
        digest = hashlib.sha256(self.identity.encode())
        digest.update(json.dumps(sorted((k.decode(), v.decode()) for k, v in metadata.items())).encode())
        for r in requests:
            digest.update(json.dumps([r.doc_id, r.idx, r.request_type, r.arguments]).encode() + b"\n")
        return self.directory / f"{digest.hexdigest()}.arrow"

    def get(self, requests: Sequence[Request], metadata: dict[bytes, bytes]) -> tuple[pa.Table, int] | None:
        """The table kept for these requests and how many of them were left-truncated, or None: not kept, or kept
        damaged (warned, and rebuilt by the caller)."""
        path = self.path(requests, metadata)
        if not path.is_file():
            return None
        data = path.read_bytes()
        body, kept_digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
        if len(data) <= _DIGEST_BYTES or hashlib.sha256(body).digest() != kept_digest:
            log.warning("request cache entry %s is damaged (its SHA-256 does not match); building the requests again",
                        path)
            return None
        table = pa.ipc.open_file(pa.BufferReader(body)).read_all()
        kept = dict(table.schema.metadata)
        truncated = int(kept.pop(_TRUNCATED_KEY))
        return table.replace_schema_metadata(kept), truncated

    def put(self, requests: Sequence[Request], metadata: dict[bytes, bytes], table: pa.Table, truncated: int
            ) -> None:
        sink = pa.BufferOutputStream()
        kept = table.replace_schema_metadata({**(table.schema.metadata or {}), _TRUNCATED_KEY: str(truncated).encode()})
        with pa.ipc.new_file(sink, kept.schema) as writer:
            writer.write_table(kept)
        body = sink.getvalue().to_pybytes()
        write_atomic(self.path(requests, metadata), body + hashlib.sha256(body).digest())
