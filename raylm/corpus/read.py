"""A corpus of any size as a streaming Ray Dataset with one `text` column (and the file each row came from).

Parquet and JSONL rows are one document each, read from `--text-column`. A plain-text file is one document per
non-empty line: Ray's text reader splits a file into lines, and lines are the largest unit that can stream
without holding a whole file's worth of grouping state (each text file is still read whole, so a single
multi-GB .txt file needs that much memory; split it into shards). Paths are local or any pyarrow filesystem
URI (s3://, gs://, ...), with globs.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs

from raylm.errors import InputError

if TYPE_CHECKING:
    import ray.data

FORMATS = ("auto", "parquet", "jsonl", "txt")
_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".txt": "txt"}


def detect_format(data: str) -> str:
    """The format named by the path's extension (glob or file); a directory needs --format."""
    name = data.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise InputError(data, "cannot tell the format from the file name; pass --format parquet, jsonl or txt")


def expand_paths(data: str) -> list[str]:
    """A glob -> the sorted files it matches (Ray's readers take files and directories, not patterns)."""
    if not any(c in data for c in "*?["):
        return [data]
    if "://" not in data:
        paths = sorted(glob.glob(os.path.expanduser(data), recursive=True))
    else:
        scheme, rest = data.split("://", 1)
        base = rest[:min(rest.find(c) for c in "*?[" if c in rest)].rsplit("/", 1)[0]
        try:
            fs, root = pyarrow.fs.FileSystem.from_uri(f"{scheme}://{base}")
            infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
        except (OSError, ValueError) as e:
            raise InputError(data, f"cannot list files: {_first_line(e)}") from e
        paths = sorted(f"{scheme}://{i.path}" for i in infos
                       if i.type == pyarrow.fs.FileType.File and _glob_match(i.path, rest))
    if not paths:
        raise InputError(data, "no files match")
    return paths


def _glob_match(path: str, pattern: str) -> bool:
    """Glob semantics for listed paths: `*` stays within one directory unless the pattern has `**`."""
    same_depth = "**" in pattern or path.count("/") == pattern.count("/")
    return same_depth and fnmatch.fnmatch(path, pattern)


def read_corpus(data: str | Sequence[str], fmt: str = "auto", text_column: str = "text",
                limit_docs: int | None = None, keep_empty_lines: bool = False) -> ray.data.Dataset:
    """Lazily read the corpus (one path or glob, or several of one format); the column names are checked now so a
    wrong one fails before any model loads. `keep_empty_lines` keeps a text file's empty lines as empty documents,
    so that a row's index in its file is its line number."""
    import ray.data  # here, not at the top: it takes a second to import and `raylm eval` never needs it

    sources = [data] if isinstance(data, str) else list(data)
    data = ", ".join(sources)
    formats = {detect_format(d) if fmt == "auto" else fmt for d in sources}
    if len(formats) > 1:
        raise InputError(data, f"the paths hold different formats ({', '.join(sorted(formats))}); pass one format "
                               "at a time")
    fmt = formats.pop()
    paths = [p for d in sources for p in expand_paths(d)]
    try:
        if fmt == "parquet":
            ds = ray.data.read_parquet(paths, include_paths=True)
        elif fmt == "jsonl":
            ds = ray.data.read_json(paths, include_paths=True)
        elif fmt == "txt":
            ds = ray.data.read_text(paths, include_paths=True, drop_empty_lines=not keep_empty_lines)
            text_column = "text"
        else:
            raise InputError(data, f"unknown format '{fmt}' (use {', '.join(FORMATS)})")
        schema = ds.schema()
    except (FileNotFoundError, OSError, ValueError) as e:
        raise InputError(data, f"cannot read the corpus: {_first_line(e)}") from e
    if schema is None:
        raise InputError(data, "the corpus has no rows")
    if text_column not in schema.names:
        raise InputError(data, f"no such column (columns: {', '.join(schema.names)})", field=text_column)
    ds = ds.select_columns([text_column, "path"])
    if text_column != "text":
        ds = ds.rename_columns({text_column: "text"})
    # Output order = input order, so the driver can number documents as they arrive and --limit-docs takes
    # the first N.
    ds.context.execution_options.preserve_order = True
    return ds.limit(limit_docs) if limit_docs is not None else ds


def document_texts(batch: pa.Table) -> list[str]:
    """A batch's texts, refusing a row whose text is not a string (a null, a number) with its file and field."""
    texts = batch["text"].to_pylist()
    for path, text in zip(batch["path"].to_pylist(), texts):
        if not isinstance(text, str):
            raise InputError(path, f"expected a document's text, got {type(text).__name__}", field="text")
    return texts


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
