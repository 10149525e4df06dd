"""A corpus of any size as a streaming Ray Dataset with one `text` column (and the file each row came from).

Parquet and JSONL rows (JSONL also gzip'd, as `.jsonl.gz`: Paloma's shards) are one document each, read from
`--text-column`; `--domain-column` names the column (or `path`, the file) that groups them into domains. A
plain-text file is one document per non-empty line: Ray's text reader splits a file into lines, and lines are
the largest unit that can stream without holding a whole file's worth of grouping state (each text file is
still read whole, so a single multi-GB .txt file needs that much memory; split it into shards). Paths are local
or any pyarrow filesystem URI (s3://, gs://, ...), with globs.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs

from raylm.errors import InputError
from raylm.results.corpus_labels import PATH_DOMAIN

if TYPE_CHECKING:
    import ray.data

FORMATS = ("auto", "parquet", "jsonl", "txt")
_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl", ".json.gz": "jsonl",
             ".txt": "txt"}


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


def data_files(data: str | Sequence[str]) -> list[dict[str, Any]]:
    """Every file the corpus reads, with its size and modification time: what a checkpoint keys the data by, so
    that a file replaced, grown or touched since is noticed. A directory counts as the files under it."""
    out = []
    for path in [p for d in ([data] if isinstance(data, str) else data) for p in expand_paths(d)]:
        try:
            fs, root = pyarrow.fs.FileSystem.from_uri(path) if "://" in path else (
                pyarrow.fs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path)))
            info = fs.get_file_info(root)
            infos = (fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
                     if info.type == pyarrow.fs.FileType.Directory else [info])
        except (OSError, ValueError) as e:
            raise InputError(path, f"cannot read the corpus: {_first_line(e)}") from e
        for i in sorted(infos, key=lambda i: i.path):
            if i.type == pyarrow.fs.FileType.NotFound:
                raise InputError(path, "cannot read the corpus: no such file")
            if i.type == pyarrow.fs.FileType.File:
                out.append({"path": i.path, "size": i.size, "mtime_ns": i.mtime_ns})
    return out


def _glob_match(path: str, pattern: str) -> bool:
    """Glob semantics for listed paths: `*` stays within one directory unless the pattern has `**`."""
    same_depth = "**" in pattern or path.count("/") == pattern.count("/")
    return same_depth and fnmatch.fnmatch(path, pattern)


def read_corpus(data: str | Sequence[str], fmt: str = "auto", text_column: str = "text",
                limit_docs: int | None = None, keep_empty_lines: bool = False,
                domain_column: str | None = None, read_cpus: float | None = None) -> ray.data.Dataset:
    """Lazily read the corpus (one path or glob, or several of one format); the column names are checked now so a
    wrong one fails before any model loads. `keep_empty_lines` keeps a text file's empty lines as empty documents,
    so that a row's index in its file is its line number. A `domain_column` other than `path` is kept as a
    `domain` column. `read_cpus`: the CPUs each read task asks for (None: Ray Data's default, one), 0 where
model actors that hold every CPU wait for the rows."""
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
            ds = ray.data.read_parquet(paths, include_paths=True, num_cpus=read_cpus)
        elif fmt == "jsonl":
            ds = ray.data.read_json(paths, include_paths=True, num_cpus=read_cpus)
        elif fmt == "txt":
            ds = ray.data.read_text(paths, include_paths=True, drop_empty_lines=not keep_empty_lines,
                                    num_cpus=read_cpus)
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
    domain = domain_column not in (None, PATH_DOMAIN)
    if domain and domain_column not in schema.names:
        raise InputError(data, f"no such column (columns: {', '.join(schema.names)})", field=domain_column)
    ds = ds.select_columns([text_column, "path", *([domain_column] if domain else [])], num_cpus=read_cpus)
    renames = {text_column: "text", **({domain_column: "domain"} if domain else {})}
    if any(old != new for old, new in renames.items()):
        ds = ds.rename_columns({old: new for old, new in renames.items() if old != new}, num_cpus=read_cpus)
    # Output order = input order, so the driver can number documents as they arrive and --limit-docs takes
    # the first N.
    ds.context.execution_options.preserve_order = True
    return ds.limit(limit_docs) if limit_docs is not None else ds


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
