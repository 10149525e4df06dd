"""A corpus of any size as a streaming Ray Dataset with one `text` column (and the file each row came from).

Parquet and JSONL rows (JSONL also gzip'd, as `.jsonl.gz`: Paloma's shards) are one document each, read from
`--text-column`; `--domain-column` names the column (or `path`, the file) that groups them into domains. A
plain-text file is one document per non-empty line: Ray's text reader splits a file into lines, and lines are
the largest unit that can stream without holding a whole file's worth of grouping state (each text file is
still read whole, so a single multi-GB .txt file needs that much memory; split it into shards). Paths are local
or any filesystem URI (s3://, gs://, ...), with globs, parsed once, by raylm.storage.location: the files are read
through the filesystem their URI names, credentials and query options included, and the URI is shown redacted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs
import pyarrow.json
import pyarrow.parquet

from raylm.errors import InputError
from raylm.results.corpus_labels import PATH_DOMAIN
from raylm.storage.location import Location, expand, is_uri, redact, split_query, without_secrets

if TYPE_CHECKING:
    import ray.data

FORMATS = ("auto", "parquet", "jsonl", "txt")
_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl", ".json.gz": "jsonl",
             ".txt": "txt"}


def detect_format(data: str) -> str:
    """The format named by the path's extension (glob or file; a URI's query options aside); a directory needs
    --format."""
    path = split_query(data)[0] if is_uri(data) else data
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise InputError(redact(data), "cannot tell the format from the file name; pass --format parquet, jsonl or txt")


def expand_paths(data: str) -> list[Location]:
    """A path, URI or glob -> what it names (Ray's readers take files and directories, not patterns), each on the
    filesystem its URI was parsed to, so that the URI's credentials and query options reach the read."""
    paths = expand(data, "corpus")
    if not paths:
        raise InputError(redact(data), "no files match")
    return paths


def data_files(data: str | Sequence[str]) -> list[dict[str, Any]]:
    """Every file the corpus reads, with its size and modification time: what a checkpoint keys the data by, so
    that a file replaced, grown or touched since is noticed. A directory counts as the files under it."""
    out = []
    for where in [p for d in ([data] if isinstance(data, str) else data) for p in expand_paths(d)]:
        try:
            info = where.fs.get_file_info(where.path)
            infos = (where.fs.get_file_info(pyarrow.fs.FileSelector(where.path, recursive=True))
                     if info.type == pyarrow.fs.FileType.Directory else [info])
        except (OSError, ValueError) as e:
            raise InputError(str(where), f"cannot read the corpus: {_first_line(e)}") from e
        for i in sorted(infos, key=lambda i: i.path):
            if i.type == pyarrow.fs.FileType.NotFound:
                raise InputError(str(where), "cannot read the corpus: no such file")
            if i.type == pyarrow.fs.FileType.File:
                out.append({"path": i.path, "size": i.size, "mtime_ns": i.mtime_ns})
    return out


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
    data = redact(", ".join(sources))
    formats = {detect_format(d) if fmt == "auto" else fmt for d in sources}
    if len(formats) > 1:
        raise InputError(data, f"the paths hold different formats ({', '.join(sorted(formats))}); pass one format "
                               "at a time")
    fmt = formats.pop()
    located = [p for d in sources for p in expand_paths(d)]
    fs = located[0].fs
    if not all(p.fs.equals(fs) for p in located[1:]):
        raise InputError(data, "the paths are on different filesystems (or open them with different options); "
                               "read one at a time")
    # The filesystem the URI was parsed to, with its credentials and options: Ray would parse a URI again.
    paths, common = [p.path for p in located], {"include_paths": True, "filesystem": fs, "num_cpus": read_cpus}
    try:
        if fmt == "parquet":
            ds = ray.data.read_parquet(paths, **common)
        elif fmt == "jsonl":
            ds = ray.data.read_json(paths, **common)
        elif fmt == "txt":
            ds = ray.data.read_text(paths, drop_empty_lines=not keep_empty_lines, **common)
            text_column = "text"
        else:
            raise InputError(data, f"unknown format '{fmt}' (use {', '.join(FORMATS)})")
        schema = ds.schema()
    except (FileNotFoundError, OSError, ValueError) as e:
        raise InputError(data, f"cannot read the corpus: {without_secrets(_first_line(e), ', '.join(sources))}") from e
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


# What Ray Data's readers keep of the files a path names: their default file extensions per format (none for text),
# and, inside a directory, no file whose path below it starts with one of these prefixes.
RAY_EXTENSIONS = {"parquet": ("parquet",), "txt": (),
                  "jsonl": tuple(f"{name}{z}" for z in ("", ".gz", ".br", ".zst", ".lz4")
                                 for name in ("json", "jsonl"))}
RAY_SKIPPED_PREFIXES = (".", "_")


def read_documents(data: str, fmt: str, text_column: str, limit_docs: int | None, domain_column: str | None,
                   rows: int) -> Iterator[pa.Table]:
    """The documents read_corpus reads (the same files in the same order, the same rows, --limit-docs), in batches
    of `rows` with their `text` and `path`, read in this process with pyarrow alone: a dry run plans the run's
    batches from them and must start no Ray. The batches are cut where the run's are (every `rows` documents:
    raylm.corpus.resume.blocks_of_batches)."""
    fmt = detect_format(data) if fmt == "auto" else fmt
    pending: list[pa.Table] = []
    held = read = 0
    for fs, path in _ray_files(data, fmt):
        for table in _file_documents(fs, path, fmt, text_column, domain_column):
            if limit_docs is not None:
                table = table.slice(0, limit_docs - read)
            read += table.num_rows
            pending.append(table)
            held += table.num_rows
            while held >= rows:
                batch = pa.concat_tables(pending)
                yield batch.slice(0, rows)
                pending, held = [batch.slice(rows)], held - rows
            if limit_docs is not None and read >= limit_docs:
                break
        if limit_docs is not None and read >= limit_docs:
            break
    if held:
        yield pa.concat_tables(pending)


def _ray_files(data: str, fmt: str) -> list[tuple[pyarrow.fs.FileSystem, str]]:
    """The files Ray Data reads for `data`, in its order: a directory's files sorted, less those it skips."""
    out = []
    for where in expand_paths(data):
        try:
            info = where.fs.get_file_info(where.path)
            if info.type == pyarrow.fs.FileType.Directory:
                base = where.path.rstrip("/")
                found = where.fs.get_file_info(pyarrow.fs.FileSelector(base, recursive=True))
                files = sorted(i.path for i in found if i.is_file and
                               not i.path[len(base):].lstrip("/").startswith(RAY_SKIPPED_PREFIXES))
            elif info.type == pyarrow.fs.FileType.NotFound:
                raise InputError(str(where), "cannot read the corpus: no such file")
            else:
                files = [where.path]
        except (OSError, ValueError) as e:
            raise InputError(str(where), f"cannot read the corpus: {_first_line(e)}") from e
        suffixes = tuple(f".{e}" for e in RAY_EXTENSIONS[fmt])
        out += [(where.fs, f) for f in files if not suffixes or f.lower().endswith(suffixes)]
    if not out:
        raise InputError(redact(data), "the corpus has no rows")
    return out


def _file_documents(fs: pyarrow.fs.FileSystem, path: str, fmt: str, text_column: str, domain_column: str | None
                    ) -> Iterator[pa.Table]:
    """One file's documents as read_corpus's rows: `text`, `path`, and `domain` where a column names it."""
    domain = domain_column not in (None, PATH_DOMAIN)
    try:
        if fmt == "parquet":
            with fs.open_input_file(path) as f:
                parquet = pyarrow.parquet.ParquetFile(f)
                names = parquet.schema_arrow.names
                _check_columns(path, names, text_column, domain_column if domain else None)
                for batch in parquet.iter_batches(columns=[text_column, *([domain_column] if domain else [])]):
                    yield _documents(pa.Table.from_batches([batch]), path, text_column, domain_column, domain)
            return
        with fs.open_input_stream(path, compression="detect") as f:
            if fmt == "jsonl":
                table = pyarrow.json.read_json(f)
            else:
                lines = [line for line in f.readall().decode("utf-8").splitlines() if line.strip()]
                table, text_column, domain = pa.table({"text": pa.array(lines, pa.string())}), "text", False
    except (OSError, ValueError) as e:
        raise InputError(path, f"cannot read the corpus: {_first_line(e)}") from e
    _check_columns(path, table.column_names, text_column, domain_column if domain else None)
    yield _documents(table, path, text_column, domain_column, domain)


def _check_columns(path: str, names: list[str], text_column: str, domain_column: str | None) -> None:
    for column in (text_column, domain_column):
        if column is not None and column not in names:
            raise InputError(path, f"no such column (columns: {', '.join(names)})", field=column)


def _documents(table: pa.Table, path: str, text_column: str, domain_column: str | None, domain: bool) -> pa.Table:
    columns = {"text": table[text_column], "path": pa.array([path] * table.num_rows, pa.string())}
    if domain:
        columns["domain"] = table[domain_column]
    return pa.table(columns)
