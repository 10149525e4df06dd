"""What in an output directory raylm can prove it wrote, so that it never deletes or overwrites anything else.

`--output` may be a directory that also holds the user's own files, a training run's `checkpoint/` or someone
else's `samples/`. raylm's files carry proof: results.json names raylm's version in its config, the checkpoint
manifest in its code fingerprint, and every Parquet file raylm writes has a `raylm.` key in its schema metadata.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import raylm
from raylm.errors import RaylmError
from raylm.storage.location import Location, location

log = logging.getLogger(__name__)

PARQUET_KEY = b"raylm.version"
CHECKPOINT_DIR = "checkpoint"
MANIFEST = "manifest.json"
SAMPLES_DIR = "samples"
RESULTS = "results.json"
# What the stages above register as theirs, so that this floor knows none of their formats: the folders of
# Parquet parts under checkpoint/ (raylm.cluster.checkpoint), and for a file without raylm's mark beside the
# samples, the Parquet file whose mark proves it raylm's (raylm.results.sample_logs: lm-eval's sample logs).
_CHECKPOINT_PARTS: set[str] = set()
_COMPANIONS: list[Callable[[str], str | None]] = []


def own_checkpoint_parts(folder: str) -> None:
    """A stage that keeps Parquet parts in checkpoint/`folder`: --overwrite removes them with raylm's manifest."""
    _CHECKPOINT_PARTS.add(folder)


def own_companions(proof: Callable[[str], str | None]) -> None:
    """A stage that writes files raylm cannot mark beside its Parquet samples: `proof(name)` is the Parquet file in
    the same folder whose mark proves the file `name` raylm's, or None for a name that is not the stage's."""
    _COMPANIONS.append(proof)


def tagged(table: pa.Table) -> pa.Table:
    """The table with raylm's mark in its schema metadata (kept alongside any metadata it already has)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), PARQUET_KEY: raylm.__version__.encode()})


def tagged_schema(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), PARQUET_KEY: raylm.__version__.encode()})


def _json(path: Location) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def results_kind(path: Location) -> str | None:
    """The command that wrote a results file raylm wrote (its config's `command`; `eval`, which names none),
    else None."""
    data = _json(path)
    config = data.get("config") if isinstance(data, dict) else None
    if not (isinstance(config, dict) and isinstance(config.get("versions"), dict) and "raylm" in config["versions"]):
        return None
    return str(config.get("command", "eval"))


def check_results_owner(out_dir: str | os.PathLike[str] | Location, command: str, results: str = RESULTS,
                        parquets: tuple[str, ...] = (), checkpoint: bool = False) -> None:
    """The one rule for a command about to write into out_dir, checked before any work: a rerun of the command
    replaces its own outputs; another command's, or a file raylm did not write, stays, and the run is refused.

    `results` is the command's JSON file (raylm's version and the command in its config), `parquets` the Parquet
    files it writes at fixed names (raylm's mark in their schema), `checkpoint` whether it keeps a checkpoint/
    (raylm's manifest in it)."""
    out_dir = location(out_dir)
    path = out_dir / results
    found = results_kind(path) if path.exists() else command
    if found != command:
        what = f"holds the results of `raylm {found}`" if found else "was not written by raylm"
        raise RaylmError(f"'{path}' {what}; use another --output")
    for name in parquets:
        if (out_dir / name).exists() and not is_raylm_parquet(out_dir / name):
            raise RaylmError(f"'{out_dir / name}' was not written by raylm; use another --output")
    if checkpoint and foreign_checkpoint(out_dir):
        raise RaylmError(f"'{out_dir / CHECKPOINT_DIR}' holds files raylm did not write (no raylm {MANIFEST}); use "
                         "another --output")


def is_raylm_manifest(path: Location) -> bool:
    data = _json(path)
    return isinstance(data, dict) and isinstance(data.get("code"), dict) and "raylm" in data["code"]


def is_raylm_parquet(path: str | os.PathLike[str] | Location) -> bool:
    try:
        with location(path).open_input() as f:
            metadata = pq.read_schema(f).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return any(key.startswith(b"raylm.") for key in metadata)


def foreign_checkpoint(out_dir: Location) -> bool:
    """A checkpoint/ directory with contents but no raylm manifest: raylm must neither resume from it nor write
    into it."""
    root = out_dir / CHECKPOINT_DIR
    return root.is_dir() and bool(root.iterdir()) and not is_raylm_manifest(root / MANIFEST)


def remove_raylm_files(out_dir: Location) -> None:
    """Delete results.json, the checkpoint and the samples raylm wrote under out_dir, and the directories they
    leave empty; anything else stays, named in a warning."""
    results = out_dir / RESULTS
    if results.is_file() and results_kind(results) is not None:
        results.unlink()
    checkpoint = out_dir / CHECKPOINT_DIR
    if is_raylm_manifest(checkpoint / MANIFEST):
        for folder in sorted(_CHECKPOINT_PARTS):
            _remove_parquet(checkpoint / folder)
        (checkpoint / MANIFEST).unlink()
        _remove_if_empty(checkpoint)
    _remove_parquet(out_dir / SAMPLES_DIR, companions=True)


def _remove_parquet(directory: Location, companions: bool = False) -> None:
    """raylm's Parquet files in directory; with companions, also every file a registered stage proves raylm's by
    one of them (own_companions)."""
    if not directory.is_dir():
        return
    ours = {path.name: path for path in directory.iterdir()
            if path.suffix == ".parquet" and path.is_file() and is_raylm_parquet(path)}
    if companions:
        for path in directory.iterdir():
            if any(proof(path.name) in ours for proof in _COMPANIONS) and path.is_file():
                path.unlink()
    for path in ours.values():
        path.unlink()
    _remove_if_empty(directory)


def _remove_if_empty(directory: Location) -> None:
    left = directory.iterdir()
    if left:
        log.warning("--overwrite left %s in place: raylm did not write %s", directory,
                    ", ".join(sorted(p.name for p in left)[:5]) + (" ..." if len(left) > 5 else ""))
        return
    directory.rmdir()
