"""Which weights a run scores, pinned and fingerprinted, so that resumed shards always come from the same model.

A hub id names a branch that can move: resolved to its commit hash once, when the run starts, the same commit is
what every actor loads and what the checkpoint records, so a rerun after `main` moved is refused instead of
mixing shards of two models. Local weights are fingerprinted by their contents (size and sampled blocks), not
their modification times, so a copied or touched model resumes and a changed one does not.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import replace
from pathlib import Path

from raylm.errors import RaylmError, first_line
from raylm.models.spec import ModelSpec, looks_local

log = logging.getLogger(__name__)

COMMIT = re.compile(r"[0-9a-f]{40}")
SAMPLED_BLOCKS = 16
BLOCK_BYTES = 64 * 1024


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
    """Size plus SAMPLED_BLOCKS evenly spaced blocks (first and last included), or the whole of a small file: a
    few MiB read for many-GB weights, and retrained or re-quantised weights differ in every block."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}\0".encode())
    with open(path, "rb") as f:
        if size <= SAMPLED_BLOCKS * BLOCK_BYTES:
            digest.update(f.read())
        else:
            for i in range(SAMPLED_BLOCKS):
                f.seek((size - BLOCK_BYTES) * i // (SAMPLED_BLOCKS - 1))
                digest.update(f.read(BLOCK_BYTES))
    return digest.hexdigest()


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
