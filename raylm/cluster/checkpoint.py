"""Per-shard results on disk under `--output`, so a driver that dies mid-run loses only the shards in flight.

Shards are cut on the driver from the request tables alone, so a shard's index names the same requests whatever
the actor count; a rerun of the same command reloads finished shards and scores only the rest. A manifest
fingerprints everything that decides a shard's requests or their scores (model commit or weight contents, tasks,
the request tables themselves, few-shot settings, limit, seeds, include path, shard size, the versions of torch,
transformers and lm-eval, raylm's code), every shard file records the device and dtype its actor scored with, and
results of a different run are never mixed in. raylm's code is fingerprinted as its syntax trees without comments
and docstrings (source_digest), so a fix to either resumes a run, and a sweep keeps its finished points, rather
than scoring everything again. Shards are laid out in token order (raylm.requests.order), a function of the
request tables, the shard size and raylm's code, all three fingerprinted, so a resumed run cuts the same shards;
each shard file also keeps the tokens its actor computed, for config.tokens.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import raylm
from raylm.cluster.scored import ScoredShard
from raylm.errors import RaylmError
from raylm.models.identity import adapter_digest, digest_entry, keep_digest, kept_digest, model_digest
from raylm.models.spec import ModelSpec
from raylm.requests.shards import Shard
from raylm.scoring.sums import shard_sums
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location
from raylm.storage.ownership import (
    CHECKPOINT_DIR,
    MANIFEST,
    RESULTS,
    check_results_owner,
    own_checkpoint_parts,
    remove_raylm_files,
    tagged,
)

log = logging.getLogger(__name__)

_PID_KEY = b"raylm.pid"  # also what marks a shard file as raylm's (raylm.storage.ownership)
_PREFIX_SHARING_KEY = b"raylm.prefix_sharing"
_DEVICE_KEY = b"raylm.device"
_DTYPE_KEY = b"raylm.dtype"
_TOKENS_IN_REQUESTS_KEY = b"raylm.tokens_in_requests"
_COMPUTED_TOKENS_KEY = b"raylm.computed_tokens"
SCORING_LIBRARIES = ("torch", "transformers", "lm_eval")
RAYLM_ROOT = Path(raylm.__file__).parent
PARTS = "shards"  # DIR/checkpoint/shards/<index>.parquet: a shard each, or a corpus run's parts
own_checkpoint_parts(PARTS)


def table_digest(table: pa.Table) -> str:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


@functools.lru_cache(maxsize=4)
def source_digest(root: Path = RAYLM_ROOT) -> str:
    """The code version: every module under `root` by its path and its syntax tree, less what cannot change a
    score. Comments never reach the tree, and statements that are only a string literal (docstrings) are dropped;
    line numbers are not dumped, so a comment or docstring edit that moves code leaves the digest as it was,
    while any change to what the code does (a constant, an expression, a new module) changes it. The dump's
    format follows Python's ast module, so a Python upgrade may change the digest too.

    Parsing every module takes a second on a small machine, on the path of every run's start, so the digest is kept
    in raylm's cache under the modules' identities (path, inode, size, mtime and ctime each, and the Python that
    dumped them): an edit changes the ctime, which nothing sets back, so the digest is parsed afresh whenever a
    module may have changed. In-process it is also kept, since a sweep fingerprints every point."""
    modules = sorted(root.rglob("*.py"))
    key = {"path": str(root.resolve()), "python": sys.version,
           "modules": [[m.relative_to(root).as_posix(), *_identity(m.stat())] for m in modules]}
    entry = digest_entry(key)
    kept = kept_digest(entry, key)
    if kept is not None:
        return kept
    digest = hashlib.sha256()
    for path in modules:
        tree = _Docstrings().visit(ast.parse(path.read_bytes(), filename=str(path)))
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    if entry is not None:
        keep_digest(entry, key, digest.hexdigest())
    return digest.hexdigest()


def _identity(stat: os.stat_result) -> list[int]:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


class _Docstrings(ast.NodeTransformer):
    """Removes statements that are only a string literal: module, class and function docstrings, and the bare
    strings some code documents attributes with. Evaluating one has no effect."""

    def visit_Expr(self, node: ast.Expr) -> ast.Expr | None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        return node


def library_versions() -> dict[str, str | None]:
    """The installed libraries that compute a shard's scores (torch, transformers) or build its requests and
    metrics (lm-eval; None where it is not installed)."""
    out: dict[str, str | None] = {}
    for name in SCORING_LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint(spec: ModelSpec, tasks: tuple[str, ...], tables: dict[str, tuple[str, pa.Table]],
                shards: list[Shard], settings: dict[str, Any]) -> dict[str, Any]:
    """Everything a shard's results depend on, except the actor count and batch size, which must not matter, and
    the device and dtype the actors score with, which only the actors know (every shard file records them, and
    Checkpoint.check_scored_with refuses to mix them). `settings` are the run's few-shot, limit, seed and
    include-path settings, each its own key so that a refusal names the one that changed.

    `spec` must be pinned (raylm.models.identity.pin_revision): a hub model is then fingerprinted by its
    commit, never by a branch name that can move."""
    return {
        "model": model_fingerprint(spec),
        "tasks": list(tasks),
        "data": {name: table_digest(table) for name, (_, table) in tables.items()},
        **settings,
        "shards": [[s.task, s.table.num_rows] for s in shards],
        "versions": library_versions(),
        "code": {"raylm": raylm.__version__, "source": source_digest()},
    }


def model_fingerprint(spec: ModelSpec) -> dict[str, Any]:
    """A pinned model as a manifest keys it: its settings and its weights' commit or file digests."""
    return {**spec.as_dict(), "files": model_digest(spec),
            **({"adapter_files": adapter_digest(spec)} if spec.peft is not None else {})}


def scored_with(shard: ScoredShard) -> str:
    """Where and at what precision a shard was scored, as messages name it: 'cpu/float32'."""
    return f"{shard.device}/{shard.dtype}"


class Checkpoint:
    """One run's finished shards: `DIR/checkpoint/manifest.json` and `DIR/checkpoint/shards/<index>.parquet`, DIR
    a local directory or a filesystem URI (raylm.storage.location): each shard reaches it as it is scored, so a
    run whose whole cluster was lost resumes from it on another."""

    def __init__(self, out_dir: str | os.PathLike[str] | Location, manifest: dict[str, Any], command: str = "eval"):
        """`command`: the raylm command whose results.json DIR may hold beside the checkpoint."""
        self.out_dir = location(out_dir)
        self.root = self.out_dir / CHECKPOINT_DIR
        self.manifest = manifest
        self.command = command

    @classmethod
    def open(cls, out_dir: str | os.PathLike[str] | Location, manifest: dict[str, Any], overwrite: bool,
             command: str = "eval") -> Checkpoint:
        """Resume the same run, refuse a different one, or (with overwrite) discard the results raylm left in DIR.
        A results.json or checkpoint/ that raylm did not write is refused either way: never resumed from,
        deleted or written over."""
        checkpoint = cls(out_dir, manifest, command)
        checkpoint.refuse_foreign()
        if overwrite:
            remove_raylm_files(checkpoint.out_dir)
        else:
            checkpoint.check_same_run()
        try:
            write_atomic(checkpoint.root / MANIFEST, json.dumps(manifest, indent=1).encode())
        except OSError as e:
            raise RaylmError(f"cannot write a checkpoint under '{checkpoint.out_dir}': {e.strerror or e}") from e
        return checkpoint

    def differences(self) -> list[str]:
        """What differs between this run and the one whose results DIR holds (its manifest's keys); empty when DIR
        holds this run's, or nothing."""
        path = self.root / MANIFEST
        if path.is_file():
            try:
                previous = json.loads(path.read_bytes())
            except (OSError, ValueError):
                return ["an unreadable checkpoint manifest"]
            if not isinstance(previous, dict):
                return ["an unreadable checkpoint manifest"]
            return [key for key in {**previous, **self.manifest} if previous.get(key) != self.manifest.get(key)]
        if (self.out_dir / RESULTS).exists():
            return ["results.json without a checkpoint"]
        return []

    def check_same_run(self) -> None:
        differs = self.differences()
        if differs:
            raise RaylmError(f"output directory '{self.out_dir}' holds results of a different run (differs in: "
                             f"{', '.join(differs)}); use another --output, or --overwrite to discard them")

    def check_scored_with(self, resumed: dict[int, ScoredShard], actors: str) -> None:
        """Shards resumed from DIR must have been scored where and as the actors of this run score (device and
        dtype as loaded, which --device auto and --dtype auto leave to the node and the model's config)."""
        other = sorted({scored_with(s) for s in resumed.values()} - {actors})
        if other:
            raise RaylmError(f"output directory '{self.out_dir}' holds shards scored on {', '.join(other)}, and "
                             f"this run's actors score on {actors}; results of the two would be mixed: use the "
                             "same --device and --dtype, another --output, or --overwrite to discard them")

    def refuse_foreign(self) -> None:
        check_results_owner(self.out_dir, self.command, checkpoint=True)

    @property
    def parts(self) -> Location:
        return self.root / PARTS

    def shard_path(self, index: int) -> Location:
        return self.parts / f"{index:06d}.parquet"

    def save(self, shard: Shard, scored: ScoredShard) -> None:
        tags = {_PID_KEY: str(scored.pid).encode(), _DEVICE_KEY: str(scored.device).encode(),
                _DTYPE_KEY: str(scored.dtype).encode()}
        if scored.prefix_sharing is not None:
            tags[_PREFIX_SHARING_KEY] = scored.prefix_sharing.encode()
        for key, count in ((_TOKENS_IN_REQUESTS_KEY, scored.tokens_in_requests),
                           (_COMPUTED_TOKENS_KEY, scored.computed_tokens)):
            if count is not None:
                tags[key] = str(count).encode()
        self.save_table(shard.index, scored.table.replace_schema_metadata(tags))

    def save_table(self, index: int, table: pa.Table) -> None:
        """Part `index` of the checkpoint, whole or not at all (raylm.storage.atomic), marked as raylm's."""
        sink = pa.BufferOutputStream()
        pq.write_table(tagged(table), sink)
        try:
            write_atomic(self.shard_path(index), sink.getvalue().to_pybytes())
        except OSError as e:
            raise RaylmError(f"cannot write checkpoint {self.shard_path(index)}: {e.strerror or e}") from e

    def tables(self) -> list[pa.Table]:
        """Every part saved with save_table, in index order (a corpus run's checkpoint: raylm.corpus.resume)."""
        parts = self.parts
        if not parts.is_dir():
            return []
        out = []
        for path in sorted((p for p in parts.iterdir() if p.suffix == ".parquet"), key=lambda p: p.name):
            try:
                with path.open_input() as f:
                    out.append(pq.read_table(f))
            except (OSError, pa.ArrowException) as e:
                log.warning("checkpoint %s is unreadable (%s); scoring its documents again", path, e)
        return out

    def load(self, shards: list[Shard]) -> dict[int, ScoredShard]:
        """Finished shards by index; a file that does not hold exactly its shard's requests is scored again."""
        done: dict[int, ScoredShard] = {}
        written = {p.name for p in self.parts.iterdir()}  # one listing, not a request per shard
        for shard in shards:
            path = self.shard_path(shard.index)
            if path.name not in written:
                continue
            try:
                with path.open_input() as f:
                    table = pq.read_table(f)
            except (OSError, pa.ArrowException) as e:
                log.warning("checkpoint %s is unreadable (%s); scoring shard %d again", path, e, shard.index)
                continue
            if not _same_requests(table, shard.table):
                log.warning("checkpoint %s does not match shard %d; scoring it again", path, shard.index)
                continue
            tags = table.schema.metadata or {}
            pid = int(tags.get(_PID_KEY, b"0"))
            verdict = tags[_PREFIX_SHARING_KEY].decode() if _PREFIX_SHARING_KEY in tags else None
            done[shard.index] = ScoredShard(table.replace_schema_metadata(None), shard_sums(shard.kind, table), pid,
                                            verdict, tags.get(_DEVICE_KEY, b"unknown").decode(),
                                            tags.get(_DTYPE_KEY, b"unknown").decode(),
                                            *(int(tags[k]) if k in tags else None
                                              for k in (_TOKENS_IN_REQUESTS_KEY, _COMPUTED_TOKENS_KEY)))
        return done


def _same_requests(scored: pa.Table, requests: pa.Table) -> bool:
    keys = ("doc_id", "req_idx")
    return set(keys) <= set(scored.column_names) and all(
        scored[k].to_pylist() == requests[k].to_pylist() for k in keys)
