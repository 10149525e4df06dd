"""One writer per output directory: an advisory lock that every raylm command writing there holds for its run.

Two runs on one `--output` (two shells, a sweep and an eval) would interleave checkpoints and overwrite each other's
results. So a command takes an exclusive flock on DIR/.raylm.lock before it writes anything and keeps it until it is
done; a second run stops at once, naming the holder, whose pid, host and command are in the file. Once the holder is
gone (below: how soon, per filesystem), the next run takes the lock over and logs whose it was. The lock is
advisory: it stops other raylm runs, not a user's `rm` or another program.

What the lock guarantees depends on the filesystem DIR is on:

- Local (ext4, xfs, tmpfs, ...): exclusive between processes of this node, per open file description. The kernel
  releases it when its holder's process ends, however it ends (SIGKILL, the OOM killer), and a reboot forgets it.
  What counts is the filesystem under DIR, not how its path looks: a bind mount of an NFS export is NFS.
- NFS: the Linux client emulates flock with POSIX byte-range locks on the whole file, held by the server (through
  NLM, the lockd/statd side protocol, for NFSv2/v3; the protocol's own locks for NFSv4), so runs on different nodes
  exclude each other only where the server supports locking: a server without it typically fails the flock (ENOLCK:
  raylm stops with "cannot lock output directory"), and a mount that keeps locks local (`nolock`, `local_lock=flock`
  or `all`) lets two nodes both take it. A process that ends on a live client releases it at once; a node that
  crashes holds it on the server until its NFSv4 lease expires (nfsd's default is 90 s) or, over NFSv3, until that
  node reboots and its statd tells the server (a node that never comes back holds it until an administrator clears
  it). Not guaranteed: exclusion through a network partition longer than an NFSv4 lease, after which the server may
  give the lock to another node while the first run, not told, goes on writing its results.
- Other shared filesystems (CephFS, Lustre, GPFS, SMB, FUSE mounts of object stores) each have their own rules, set
  by their mount options: check yours before pointing two nodes at one DIR.

Within one process the lock is re-entrant per thread, so that `raylm eval` can hold it around evaluate() and the
results it writes after, while evaluate() holds it for anyone calling it directly; another thread of the same
process is refused like another process.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError

log = logging.getLogger(__name__)

LOCK_FILE = ".raylm.lock"

_held: dict[tuple[str, int], list[int]] = {}  # (directory, thread) -> [descriptor, depth]
_guard = threading.Lock()


@contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold DIR's lock for the block, or raise a one-line RaylmError naming the run that holds it."""
    key = (os.path.realpath(out_dir), threading.get_ident())
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        fd = _acquire(Path(out_dir))
        with _guard:
            entry = _held[key] = [fd, 1]
    try:
        yield
    finally:
        with _guard:
            entry[1] -= 1
            done = entry[1] == 0
            if done:
                del _held[key]
        if done:
            _release(entry[0])


def describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a run that has not yet said which"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, `{holder.get('command', '?')}`, since "
            f"{holder.get('since', '?')}")


def _acquire(out_dir: Path) -> int:
    path = out_dir / LOCK_FILE
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RaylmError(f"cannot lock output directory '{out_dir}': {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RaylmError(f"output directory '{out_dir}' is in use by another raylm run ({describe(holder)}); "
                         "wait for it to finish, or use another --output") from None
    except OSError as e:
        os.close(fd)
        raise RaylmError(f"cannot lock output directory '{out_dir}': {e.strerror or e}") from e
    previous = _read(fd)
    if previous:
        log.warning("output directory %s was last held by a run that did not finish (%s); taking it over", out_dir,
                    describe(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_me()).encode(), 0)
    return fd


def _release(fd: int) -> None:
    """A cleanly finished run leaves an empty lock file: only a run that died leaves its details behind."""
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the last descriptor of the open file releases the flock


def _read(fd: int) -> dict[str, Any] | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _me() -> dict[str, Any]:
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("raylm", "__main__.py"):
        program = "raylm"
    command = shlex.join([program, *sys.argv[1:]]).replace("\n", " ")
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
