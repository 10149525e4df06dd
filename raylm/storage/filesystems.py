"""What kind of filesystem an output is on, and what putting a file in place there promises: the one place that
tells them apart, so that writing (raylm.storage.atomic) and moving directories (raylm.storage.location) agree.

- The local disk (pyarrow's LocalFileSystem; NFS is local too): a rename replaces a file in one step.
- Object stores (S3, GCS, Azure, through pyarrow or fsspec): an object appears whole or not at all, so a file is
  put in place by a server-side copy, and a directory has no rename (it is moved file by file). pyarrow's S3 copy
  is one CopyObject request, which S3 refuses above 5 GB (Arrow's S3FileSystem::CopyFile; fsspec's s3fs copies
  part by part itself): a larger file is uploaded under its final name instead (S3_COPY_LIMIT).
- Every other filesystem (HDFS, fsspec's sftp, smb, webhdfs, ftp, ...) renames, but not every rename replaces an
  existing file in one step, which replacing a file (results.json, a checkpoint's manifest.json, the lock's lease)
  needs: pyarrow's HDFS deletes the existing file and then renames (a kill in between loses it), fsspec's smb
  fails when the target exists, webhdfs's answers `false` and raylm would go on as if it had renamed. So such a
  filesystem is probed once per output location (check_replaces), and refused in one line where it cannot.
"""

from __future__ import annotations

import logging
import uuid

import pyarrow.fs as pafs

from raylm.errors import RaylmError

log = logging.getLogger(__name__)

LOCAL, OBJECT_STORE, RENAMING = "local", "object store", "renaming"

# pyarrow's type names and fsspec's protocols of the object stores.
OBJECT_STORES = frozenset({"s3", "s3a", "gcs", "gs", "abfs", "abfss", "az"})
# Filesystems with directories, renamed as a whole (the others' directories are moved file by file).
RENAMES_DIRECTORIES = frozenset({"local", "hdfs"})
# Filesystems whose rename onto an existing file is known not to be one step, which no probe can see (the result is
# right, only a kill in the middle shows it): why, as the refusal says. fsspec's "hdfs" is pyarrow's client too.
NOT_ONE_STEP = {"hdfs": "pyarrow's HDFS client deletes the existing file, then renames the new one in its place"}
# The largest object pyarrow's S3FileSystem.copy_file (one CopyObject request) can copy: S3's limit, 5 GiB.
S3_COPY_LIMIT = 5 * 1024**3

_replacing: list[tuple[pafs.FileSystem, str]] = []  # (filesystem, directory) whose renames were found to replace


def scheme(fs: pafs.FileSystem) -> str:
    """pyarrow's name for its own filesystems ('local', 's3', 'gcs', 'abfs', 'hdfs'), fsspec's protocol for one of
    fsspec's that pyarrow wraps (PyFileSystem(FSSpecHandler(...)), as raylm does for a scheme pyarrow lacks, and as
    a user may hand one in a Location)."""
    if isinstance(fs, pafs.SubTreeFileSystem):
        return scheme(fs.base_fs)
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler):
        protocol = fs.handler.fs.protocol
        return protocol if isinstance(protocol, str) else protocol[0]
    return fs.type_name


def kind(fs: pafs.FileSystem) -> str:
    """LOCAL (pyarrow's own local filesystem alone: paths raylm can hand the OS), OBJECT_STORE or RENAMING."""
    if isinstance(fs, pafs.LocalFileSystem):
        return LOCAL
    return OBJECT_STORE if scheme(fs) in OBJECT_STORES else RENAMING


def renames_directories(fs: pafs.FileSystem) -> bool:
    return scheme(fs) in RENAMES_DIRECTORIES


def copy_limit(fs: pafs.FileSystem) -> float:
    """The largest file an object store's copy_file puts in place (no limit but pyarrow's S3's)."""
    return S3_COPY_LIMIT if fs.type_name == "s3" else float("inf")


def rename_file(fs: pafs.FileSystem, src: str, dest: str) -> None:
    """Rename a file, and make sure it happened: a rename that reports success and leaves the file where it was
    (webhdfs answering `false`) must fail the write, not leave its temporary file behind and no file in place."""
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler):
        fs.handler.fs.mv(src, dest)  # the handler's move passes recursive=, which sftp's mv does not take
    else:
        fs.move(src, dest)
    if fs.get_file_info(src).type != pafs.FileType.NotFound:
        raise OSError(f"renaming '{src}' to '{dest}' reported success but left it in place")


def check_replaces(fs: pafs.FileSystem, directory: str, shown: str) -> None:
    """Raise a one-line RaylmError unless a rename in `directory` (named `shown` to the user) replaces an existing
    file in one step; probed once per directory (and the directories under it), the first time a file is written
    there, by renaming one tiny file onto another. The local disk's rename is POSIX's, one step: never probed."""
    if kind(fs) == LOCAL or any(directory == done or directory.startswith(done + "/") for probed, done in _replacing
           if probed.equals(fs)):
        return
    why = NOT_ONE_STEP.get(scheme(fs)) or _probe(fs, directory)
    if why is not None:
        raise RaylmError(f"output '{shown}' is on a filesystem ({scheme(fs)}) that cannot replace a file in one step "
                         f"({why}), so a run killed while replacing one (a checkpoint's manifest.json) would lose "
                         "it; use a local or NFS path or an object store (s3://, gs://, abfs://)")
    _replacing.append((fs, directory))


def _probe(fs: pafs.FileSystem, directory: str) -> str | None:
    """Why a rename onto an existing file in `directory` does not replace it, or None where it does."""
    base = f"{directory}/.raylm-rename-probe-{uuid.uuid4().hex}"
    old, new = f"{base}-old", f"{base}-new"
    try:
        for path in (old, new):
            with fs.open_output_stream(path) as f:
                f.write(path.encode())
        try:
            rename_file(fs, new, old)
        except OSError as e:
            return f"renaming a file onto another failed: {e}"
        with fs.open_input_stream(old) as f:
            if f.read() != new.encode():
                return "a file renamed onto another left the other in its place"
        return None
    finally:
        for path in (old, new):
            try:
                if fs.get_file_info(path).type != pafs.FileType.NotFound:
                    fs.delete_file(path)
            except OSError as e:
                log.warning("could not delete the file %s that tested renames there: %s", path, e)
