"""An output location: a local directory or a directory on a filesystem named by URI (`s3://bucket/run`,
`gs://`, `abfs://`, `hdfs://`, `file://`), as Ray Train's `storage_path` takes one, so that results and checkpoints
can outlive the cluster that computed them.

Every stage that writes, and every read a resume makes (checkpoint, ownership checks, sweep points), goes through a
Location: pyarrow's filesystem for the URI's scheme, fsspec's (wrapped for pyarrow) where pyarrow has none.
Credentials come from the standard environment of each store (AWS_PROFILE, AWS_ACCESS_KEY_ID, ...,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY), or from the URI itself (`s3://KEY:SECRET@bucket/run`):
one parser, pyarrow's `FileSystem.from_uri`, reads every URI, endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL) and
query options (`?region=`, `?endpoint_override=`) included. A secret in a URI stays with the filesystem client: a
Location shows its URI redacted (`redact`), and so does everything raylm prints, logs or writes.

Inputs go through here too: a corpus is one or more paths, URIs or globs (`s3://KEY:SECRET@bucket/dir/*.parquet`),
each expanded (`expand`) to Locations whose filesystem carries the URI's credentials and query options to the
read. A glob is read as a shell reads one; in a URI, a `?` followed by `name=` starts the query options, any other
`?` is a wildcard.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import tempfile
import uuid
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from raylm.errors import RaylmError
from raylm.storage.filesystems import rename_file, renames_directories

# A URI's password (`scheme://user:password@host`, shown as `scheme://***@host`) and query values whose names say
# they are secrets (`?sas_token=`, `?secret_key=`). A secret holding an unescaped '/' (AWS's may) still ends at '@'.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s@:]*:[^\s@]*@")
_SECRET_QUERY = re.compile(r"(?P<name>[?&][^=&\s]*(?:key|secret|token|password|passwd|sig|credential)[^=&\s]*=)"
                           r"[^&\s]*", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# Where a URI's query options begin: the first '?' followed by a name and '=' (`?endpoint_override=...`).
_QUERY_START = re.compile(r"\?(?=[A-Za-z_][A-Za-z0-9_.-]*=)")
WILDCARDS = "*?["


class Location:
    """A file or directory on a filesystem, named in messages as the user wrote it (`uri`), less any secret in it:
    the credentials a URI carried live in `fs` alone. So a Location is passed on as it is, never re-read from its
    text."""

    def __init__(self, fs: pafs.FileSystem, path: str, uri: str, query: str = ""):
        self.fs, self.path, self.uri, self.query = fs, path.rstrip("/"), uri.rstrip("/"), query

    def __truediv__(self, name: str) -> Location:
        return Location(self.fs, f"{self.path}/{name}", f"{self.uri}/{name}", self.query)

    def __str__(self) -> str:
        return f"{self.uri}?{self.query}" if self.query else self.uri

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.fs.type_name, self.path) == (other.fs.type_name, other.path)

    def __hash__(self) -> int:
        return hash((self.fs.type_name, self.path))

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def parent(self) -> Location:
        return Location(self.fs, self.path.rsplit("/", 1)[0], self.uri.rsplit("/", 1)[0], self.query)

    @property
    def local(self) -> Path | None:
        """The path on this machine's own filesystem (NFS mounts included), else None."""
        return Path(self.path) if isinstance(self.fs, pafs.LocalFileSystem) else None

    @property
    def renames(self) -> bool:
        """Whether a directory here is renamed as a whole (else moved file by file: raylm.storage.filesystems)."""
        return renames_directories(self.fs)

    def _type(self) -> pafs.FileType:
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        return self._type() != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self._type() == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._type() == pafs.FileType.Directory

    def iterdir(self) -> list[Location]:
        """The entries directly under this directory (none where it does not exist)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [self / info.base_name for info in infos]

    def files(self) -> list[Location]:
        """Every file under this directory, at any depth."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True, recursive=True))
        return [Location(self.fs, i.path, self.uri + i.path[len(self.path):], self.query) for i in infos
                if i.type == pafs.FileType.File]

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open_input(self) -> pa.NativeFile:
        """Random access, as Parquet readers need."""
        return self.fs.open_input_file(self.path)

    def mkdir(self) -> None:
        if self.local is not None:  # for the OS's own error, as messages quote it ("Not a directory")
            self.local.mkdir(parents=True, exist_ok=True)
        else:
            self.fs.create_dir(self.path, recursive=True)

    def unlink(self) -> None:
        self.fs.delete_file(self.path)

    def rmdir(self) -> None:
        self.fs.delete_dir(self.path)

    def move(self, dest: Location) -> None:
        """Move this directory to dest: one rename where the filesystem has them, else file by file (an object
        store has no directories to rename), the deepest first, so that a move cut short leaves each directory's
        own files (a checkpoint's manifest.json) with whatever is still below them (its shards/), never files
        below without the one that says what they are."""
        dest.parent.mkdir()
        if self.renames:
            self.fs.move(self.path, dest.path)
            return
        for file in sorted(self.files(), key=lambda f: (-f.path.count("/"), f.path)):
            rename_file(self.fs, file.path, dest.path + file.path[len(self.path):])
        self.fs.delete_dir(self.path)


def is_uri(text: str) -> bool:
    """Whether text names a filesystem URI (`scheme://...`) rather than a local path: the one rule every stage
    tells them apart by, so that no two stages can disagree about the same text."""
    return _SCHEME.match(text) is not None


def location(where: str | os.PathLike[str] | Location, what: str = "output") -> Location:
    """The Location of a local path or a filesystem URI; a Location is returned as it is. `what` names the path
    in the one-line error of a URI that cannot be opened (an output, a corpus)."""
    if isinstance(where, Location):
        return where
    text = os.fspath(where)
    if not is_uri(text):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/(?!/)", text):
            raise RaylmError(f"{what} '{redact(text)}' looks like a storage URI whose '//' was folded into '/' (a "
                             f"Path does that): pass it as a string, e.g. '{redact(text.replace(':/', '://', 1))}'")
        return Location(pafs.LocalFileSystem(), os.path.abspath(text), text)
    shown = redact(text)
    base, _, query = shown.partition("?")
    try:
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except pa.ArrowInvalid as e:
            if not str(e).startswith("Unrecognized filesystem type"):  # pyarrow's word for a scheme it lacks
                raise
            fs, path = _fsspec(text)
    except (OSError, ValueError, ImportError, pa.ArrowException) as e:
        # Not chained: the client's own error may quote the secret, and a traceback would show it.
        raise RaylmError(f"cannot open {what} '{shown}': {without_secrets(str(e), text)}") from None
    return Location(fs, path, base, query)


def split_query(uri: str) -> tuple[str, str]:
    """A URI's part before its query options, and the options ('' if none). The options begin at the first '?'
    followed by `name=`; a '?' elsewhere (`shard-?.parquet`) belongs to the path, where a glob reads it."""
    match = _QUERY_START.search(uri)
    return (uri[:match.start()], uri[match.end():]) if match else (uri, "")


def has_wildcards(where: str) -> bool:
    """Whether a path or URI is a glob: a wildcard in its path, never one in a URI's query options."""
    return any(c in (split_query(where)[0] if is_uri(where) else where) for c in WILDCARDS)


def expand(where: str, what: str = "input") -> list[Location]:
    """The Locations a path, URI or glob names, for reading: a glob, what it matches, sorted (none if nothing
    does; a URI's glob matches files alone, an object store having no directories); anything else, itself,
    whether it exists or not. A local `~` is the home directory, as in a shell. The Locations of a URI share the
    filesystem its text was parsed to, credentials and query options included."""
    if not is_uri(where):
        where = os.path.expanduser(where)
        if not has_wildcards(where):
            return [location(where, what)]
        return [location(p, what) for p in sorted(glob.glob(where, recursive=True))]
    if not has_wildcards(where):
        return [location(where, what)]
    uri, query = split_query(where)
    authority = _SCHEME.match(uri).end()
    path_start = uri.find("/", authority)  # after the bucket or host (and any credentials, which may hold a '*')
    host = uri.rfind("@", authority, path_start if path_start >= 0 else len(uri)) + 1 or authority
    first = min(i for i in (uri.find(c, host) for c in WILDCARDS) if i >= 0)
    if path_start < 0 or first < path_start:
        raise RaylmError(f"{what} '{redact(where)}': a wildcard must follow the bucket or host, in the path")
    cut = uri.rfind("/", 0, first)
    base = location(uri[:cut] + (f"?{query}" if query else ""), what)
    pattern = uri[cut + 1:]
    try:
        infos = base.fs.get_file_info(pafs.FileSelector(base.path, allow_not_found=True, recursive=True))
    except (OSError, ValueError, pa.ArrowException) as e:
        raise RaylmError(f"cannot list {what} '{redact(where)}': {without_secrets(str(e), where)}") from None
    names = sorted(i.path[len(base.path) + 1:] for i in infos if i.type == pafs.FileType.File)
    return [base / name for name in names if _glob_match(name, pattern)]


def _glob_match(path: str, pattern: str) -> bool:
    """A shell's glob semantics for listed paths: `*` stays within one directory unless the pattern has `**`."""
    same_depth = "**" in pattern or path.count("/") == pattern.count("/")
    return same_depth and fnmatch.fnmatchcase(path, pattern)


def redact(text: str) -> str:
    """Text (a URI, a command line, a message) with the password of every URI in it and every query value named
    like a secret replaced by `***`; a user name alone, or an Azure container (`abfs://container@account`), stays."""
    return _SECRET_QUERY.sub(r"\g<name>***", _USERINFO.sub(r"\g<scheme>***@", text))


def without_secrets(message: str, uri: str) -> str:
    """A filesystem client's error about `uri` (or text holding several URIs), which may quote their secrets in any
    form (whole, split, decoded)."""
    secrets = {m.group(0)[len(m.group("scheme")):-1] for m in _USERINFO.finditer(uri)}
    secrets |= {m.group(0)[len(m.group("name")):] for m in _SECRET_QUERY.finditer(uri)}
    for secret in sorted(secrets | {unquote(s) for s in secrets}, key=len, reverse=True):
        for part in sorted({p for p in (secret, *secret.split(":")) if len(p) > 3}, key=len, reverse=True):
            message = message.replace(part, "***")
    return redact(message)


def _fsspec(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        import fsspec
    except ImportError:
        raise RaylmError(f"pyarrow has no filesystem for '{uri}', and fsspec, which may, is not installed") from None
    fs, path = fsspec.core.url_to_fs(uri)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def prepare_output(where: str | os.PathLike[str] | Location) -> Location:
    """Fail before any scoring if results could not be written, rather than after an hour of work: a file where
    the directory should be, a bucket that does not exist, credentials that may not write."""
    out = location(where)
    try:
        if out.is_file():
            raise RaylmError(f"output path '{out}' exists and is not a directory")
        out.mkdir()
        if out.local is not None:
            with tempfile.TemporaryFile(dir=out.local):
                pass
        else:
            probe = out / f".raylm-probe-{uuid.uuid4().hex}"
            with out.fs.open_output_stream(probe.path):
                pass
            probe.unlink()
    except OSError as e:
        raise RaylmError(f"output directory '{out}' is not writable: {e.strerror or e}") from e
    return out
