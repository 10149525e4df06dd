"""Which weights a run scores, pinned and fingerprinted, so that resumed shards always come from the same model.

A hub id names a branch that can move: resolved to its commit hash once, when the run starts, the same commit is
what every actor loads and what the checkpoint records, so a rerun after `main` moved is refused instead of
mixing shards of two models. Local weights are fingerprinted by the hash of every byte of every file, not by
their modification times, so a copied or touched model resumes and a changed one does not, however small the
change (a fine-tuned head, one merged LoRA projection). Each file is read once per version of it (file_digest).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from raylm.cache import NO_CACHE_ENV, cache_dir
from raylm.errors import RaylmError, first_line
from raylm.models.spec import ModelSpec, looks_local

log = logging.getLogger(__name__)

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
DIGEST_DIR = "file-digests"  # under raylm's cache directory: one small JSON per file version hashed
CHUNK_BYTES = 8 * 1024**2
PROGRESS_BYTES = 256 * 1024**2  # files from this size show a progress bar while they are hashed


def pin_revision(spec: ModelSpec) -> ModelSpec:
    """The spec with a hub model's revision replaced by the commit it points to now (local dirs unchanged), and
    likewise a hub adapter's (--peft), pinned to its own repository's commit."""
    if spec.peft is not None and not looks_local(spec.peft) and not (
            spec.peft_revision is not None and COMMIT.fullmatch(spec.peft_revision)):
        spec = replace(spec, peft_revision=hub_commit(spec.peft, spec.peft_revision))
    if looks_local(spec.path) or (spec.revision is not None and COMMIT.fullmatch(spec.revision)):
        return spec
    return replace(spec, revision=hub_commit(spec.path, spec.revision))


def scored_commit(spec: ModelSpec) -> str | None:
    """What results.json records as the model's commit: a pinned hub model's, None for a local directory."""
    return None if looks_local(spec.path) else spec.revision


def hub_commit(repo_id: str, revision: str | None) -> str:
    """The commit a hub revision points to: asked of the hub, or with HF_HUB_OFFLINE=1 (or when the hub cannot
    be reached) read from the local cache's refs, which is what transformers would load offline."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    asked = revision or "main"
    if constants.HF_HUB_OFFLINE:
        return _cached_commit(repo_id, revision, "HF_HUB_OFFLINE is set")
    try:
        sha = HfApi().model_info(repo_id, revision=revision).sha
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise RaylmError(f"hub model '{repo_id}' at revision '{asked}': {first_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - no network or the hub failed: the local cache decides, naming this cause
        cause = first_line(e)
        commit = _cached_commit(repo_id, revision, f"the hub could not be asked ({cause})")
        log.warning("could not ask the hub which commit '%s' %s is (%s); using the cached %s", repo_id, asked,
                    cause, commit)
        return commit
    if not sha:
        raise RaylmError(f"the hub gave no commit for '{repo_id}' at revision '{asked}'")
    return sha


def _cached_commit(repo_id: str, revision: str | None, why: str) -> str:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(cached, str):
        raise RaylmError(f"cannot tell which commit of hub model '{repo_id}' revision '{revision or 'main'}' to "
                         f"load: {why}, and the local Hugging Face cache does not hold it (download it once online, "
                         "or pass a local directory)")
    return Path(cached).parent.name  # <cache>/models--org--name/snapshots/<commit>/config.json


def file_digest(path: Path) -> str:
    """The sha256 of every byte of the file, read once per version of it: kept in raylm's cache directory (outside
    the model's, which may be read-only or shared) under the file's identity, so an unchanged 16 GB checkpoint is
    not read again on every run. The identity is its resolved path, device, inode, size, mtime and ctime: a write
    in place changes the ctime, which no tool can set back, so even a change that keeps the size and restores the
    mtime is hashed afresh."""
    before = path.stat()
    key = _file_key(path, before)
    entry = digest_entry(key)
    cached = kept_digest(entry, key)
    if cached is not None:
        return cached
    digest = _hash_file(path, before.st_size)
    # A file that changed while it was read has no one digest to keep.
    if entry is not None and _file_key(path, path.stat()) == key:
        keep_digest(entry, key, digest)
    return digest


def _file_key(path: Path, stat: os.stat_result) -> dict[str, int | str]:
    return {"path": str(path.resolve()), "device": stat.st_dev, "inode": stat.st_ino, "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}


def _hash_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"hashing {path.name}",
                                     disable=size < PROGRESS_BYTES) as bar:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def digest_entry(key: dict[str, Any]) -> Path | None:
    """Where the digest of what `key` identifies is kept (its "path" names it in a warning); None with the cache
    off."""
    directory = cache_dir()
    if directory is None:
        return None
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:40]
    return directory / DIGEST_DIR / f"{name}.json"


def kept_digest(entry: Path | None, key: dict[str, Any]) -> str | None:
    if entry is None or not entry.is_file():
        return None
    try:
        kept = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    digest = kept.get("sha256") if isinstance(kept, dict) and kept.get("key") == key else None
    return digest if isinstance(digest, str) and SHA256.fullmatch(digest) else None


def keep_digest(entry: Path, key: dict[str, Any], digest: str) -> None:
    """Best effort: a cache that cannot be written costs a rehash next run, never the run."""
    partial = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=entry.parent, prefix=f".{entry.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "sha256": digest}, f)
        os.replace(partial, entry)
    except OSError as e:
        if partial is not None:
            Path(partial).unlink(missing_ok=True)
        log.warning("could not keep the digest of %s in %s (%s); it will be hashed again next run (set %s=1 to "
                    "stop trying)", key["path"], entry.parent, e.strerror or e, NO_CACHE_ENV)


def model_digest(spec: ModelSpec) -> str:
    """A pinned hub model is its commit; a local directory is the digest of each of its files' names and
    contents (file_digest)."""
    if not looks_local(spec.path):
        return f"hub:{spec.path}@{spec.revision or 'main'}"
    root = Path(spec.path).expanduser()
    digest = hashlib.sha256()
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        digest.update(f"{path.name}\0{file_digest(path)}\0".encode())
    return digest.hexdigest()


def adapter_digest(spec: ModelSpec) -> str | None:
    """The --peft adapter's identity beside the base's: its pinned commit, or its directory's contents digested as
    a model directory's are. None without an adapter."""
    if spec.peft is None:
        return None
    if not looks_local(spec.peft):
        return f"hub:{spec.peft}@{spec.peft_revision or 'main'}"
    return model_digest(replace(spec, path=spec.peft, peft=None))
