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
- A filesystem URI (s3://, gs://, abfs://, sftp://; raylm.storage.location): pyarrow's filesystems offer neither
  a lock nor a conditional write, so the lock is a lease. DIR/.raylm.lock is an object naming its holder and when
  its lease expires; the holder renews it from a background thread every third of the lease (60 s, or
  $RAYLM_LOCK_LEASE_S). A run that finds an unexpired lease stops, naming the holder and when its lease expires,
  unless the holder provably is gone: a process of this very host (same boot, same pid namespace) that no longer
  runs, whose lease is taken over at once. One that finds none, or an expired one (its holder was killed, or its
  node lost), writes its own, waits SETTLE_S and reads it back: if another run's record is there instead, it
  stops. A record that cannot be read as a lease (another program's file) is never taken for an expired one: the
  run stops, naming the file. A holder that finds its lease taken over, or that could not renew it before it
  expired, stops writing: every later write under DIR fails with one line saying so (raylm.storage.atomic.fence),
  and so does the end of its run. Not guaranteed: two runs that both find the lease free, and whose writes land
  more than SETTLE_S apart (a run stalled that long between its check and its write), both go on; a holder
  stalled longer than its lease is taken over while it still runs, and a write it had begun may land before it
  notices; and expiry is judged by each host's clock, so clocks that differ by a good part of a lease misjudge it.

Within one process the lock is re-entrant per thread, so that `raylm eval` can hold it around evaluate() and the
results it writes after, while evaluate() holds it for anyone calling it directly; another thread of the same
process is refused like another process.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError
from raylm.storage.atomic import fence, write_atomic
from raylm.storage.location import Location, location, redact

log = logging.getLogger(__name__)

LOCK_FILE = ".raylm.lock"
LEASE_ENV = "RAYLM_LOCK_LEASE_S"  # how long a lease on a filesystem URI lasts unless renewed (default 60 s)
DEFAULT_LEASE_S = 60.0
MAX_LEASE_S = 86400.0  # a day: a lease a dead holder keeps longer blocks its output for longer than anyone waits
SETTLE_S = 1.0  # how long a run waits between writing its lease and reading it back

_held: dict[tuple[str, int], list[Any]] = {}  # (directory, thread) -> [release(failed), depth]
_guard = threading.Lock()


@contextmanager
def output_lock(out_dir: str | os.PathLike[str] | Location) -> Iterator[None]:
    """Hold DIR's lock for the block, or raise a one-line RaylmError naming the run that holds it."""
    out = location(out_dir)
    lease_s = lease_seconds()
    where = os.path.realpath(out.local) if out.local is not None else f"{out.fs.type_name}:{out.path}"
    key = (where, threading.get_ident())
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        if out.local is not None:
            release = _acquire(out)
        else:
            release = _Lease(out, lease_s).acquire()
        with _guard:
            entry = _held[key] = [release, 1]
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        with _guard:
            entry[1] -= 1
            done = entry[1] == 0
            if done:
                del _held[key]
        if done:
            entry[0](failed)


def lease_seconds() -> float:
    """$RAYLM_LOCK_LEASE_S, checked: a lease must outlast the wait before its first renewal (SETTLE_S and a third
    of the lease), with room for a slow store, so at least 3 * SETTLE_S; and at most MAX_LEASE_S (far below what
    the renewer's wait and the expiry's clock time can hold)."""
    text = os.environ.get(LEASE_ENV)
    if text is None:
        return DEFAULT_LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 3 * SETTLE_S <= value <= MAX_LEASE_S:  # NaN too
        raise RaylmError(f"{LEASE_ENV}={text!r} is not a lease length: give seconds, from {3 * SETTLE_S:g} to "
                         f"{MAX_LEASE_S:g}")
    return value


def describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a run that has not yet said which"
    lease = f", lease until {_clock(holder['expires'])}" if isinstance(holder.get("expires"), (int, float)) else ""
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, `{holder.get('command', '?')}`, since "
            f"{holder.get('since', '?')}{lease}")


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(t))


def _acquire(out: Location) -> Callable[[bool], None]:
    out_dir = out.local
    path = out_dir / LOCK_FILE
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RaylmError(f"cannot lock output directory '{out}': {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RaylmError(f"output directory '{out}' is in use by another raylm run ({describe(holder)}); "
                         "wait for it to finish, or use another --output") from None
    except OSError as e:
        os.close(fd)
        raise RaylmError(f"cannot lock output directory '{out}': {e.strerror or e}") from e
    previous = _read(fd)
    if previous:
        log.warning("output directory %s was last held by a run that did not finish (%s); taking it over", out,
                    describe(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_me()).encode(), 0)
    return lambda failed: _release(fd)


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
    """Who holds the lock, as the next run is shown it: its command line with the secrets of any URI redacted."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("raylm", "__main__.py"):
        program = "raylm"
    command = redact(shlex.join([program, *sys.argv[1:]]).replace("\n", " "))
    return {"pid": os.getpid(), "host": socket.gethostname(), "processes": _process_space(), "command": command,
            "since": _clock(time.time())}


def _process_space() -> str | None:
    """What makes a pid name one process: this kernel's boot and this pid namespace (None where unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _gone(holder: dict[str, Any]) -> bool:
    """Whether the holder is provably no longer running: a process of this host's boot and pid namespace whose pid
    is not alive. A holder elsewhere (or on a host of the same name) is judged by its lease alone."""
    pid, space = holder.get("pid"), _process_space()
    if holder.get("host") != socket.gethostname() or space is None or holder.get("processes") != space:
        return False
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class _Lease:
    """DIR/.raylm.lock on a filesystem URI: a record of its holder with an expiry the holder keeps renewing."""

    def __init__(self, out: Location, lease_s: float):
        self.out, self.path, self.lease_s = out, out / LOCK_FILE, lease_s
        self.record = {**_me(), "owner": uuid.uuid4().hex, "lease_s": lease_s}
        self.stop = threading.Event()
        self.renewer = threading.Thread(target=self._renew, name="raylm-lease", daemon=True)
        self.lost: str | None = None  # why this run may no longer write to DIR

    def acquire(self) -> Callable[[bool], None]:
        previous = self._read()
        gone = previous is not None and not _expired(previous) and _gone(previous)
        if previous is not None and not _expired(previous) and not gone:
            raise self._in_use(previous)
        self._write()
        time.sleep(SETTLE_S)
        now = self._read()
        if now is None or now.get("owner") != self.record["owner"]:
            raise self._in_use(now or {})
        if gone:
            log.warning("output directory %s was held by a run of this host that is no longer running (%s); taking "
                        "it over", self.out, describe(previous))
        elif previous is not None:
            log.warning("output directory %s was last held by a run whose lease expired (%s); taking it over",
                        self.out, describe(previous))
        self.unfence = fence(self.out, self.check)
        self.renewer.start()
        return self.release

    def check(self) -> None:
        """Raise if this run lost its lease, or if it expired unrenewed (the renewer stuck in a store's I/O past it,
        where another run may take it over): it must not write to DIR any more."""
        if self._lapsed():
            raise RaylmError(f"output directory '{self.out}': {self.lost}; this run stopped writing there")

    def release(self, failed: bool) -> None:
        """The lease given up; a run that lost it and had not failed otherwise fails here, so that it exits
        non-zero (the error that failed it otherwise is the one shown, this one having been logged)."""
        self.stop.set()
        self.renewer.join()
        self.unfence()
        if self._lapsed():
            if not failed:
                self.check()
            return
        try:
            if (self._read() or {}).get("owner") == self.record["owner"]:
                self.path.unlink()
        except (OSError, RaylmError) as e:
            log.warning("could not remove the lock %s (%s); its lease expires by itself", self.path, e)

    def _lapsed(self) -> bool:
        """Whether the lease expired before it was renewed (then lost for good: another run may hold it now)."""
        if self.lost is None and time.time() >= self.record["expires"]:
            self._lose("this run's lease expired before it could renew it")
        return self.lost is not None

    def _renew(self) -> None:
        while not self.stop.wait(self.lease_s / 3):
            try:
                holder = self._read()
                if self._lapsed():  # a read that returned too late: the lease may be another run's by now
                    return
                if holder is not None and holder.get("owner") != self.record["owner"]:
                    self._lose(f"this run's lease was taken over by another raylm run ({describe(holder)})")
                    return
                self._write()
            except (OSError, RaylmError) as e:  # a store unreachable for a moment: the next renewal may reach it
                if self.lost is None and time.time() >= self.record["expires"]:
                    self._lose(f"this run's lease expired before it could renew it ({e})")
                if self.lost is not None:
                    return
                log.warning("could not renew the lease on %s: %s", self.path, e)

    def _lose(self, why: str) -> None:
        self.lost = why
        log.error("output directory %s: %s; this run stops writing there", self.out, why)

    def _write(self) -> None:
        expires = time.time() + self.lease_s
        try:
            write_atomic(self.path, json.dumps({**self.record, "expires": expires}).encode())
        except OSError as e:
            raise RaylmError(f"cannot lock output directory '{self.out}': {e}") from e
        self.record["expires"] = expires

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            data = None
        except OSError as e:
            raise RaylmError(f"cannot lock output directory '{self.out}': {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("expires"), (int, float)):
            raise RaylmError(f"'{self.path}' is not a raylm lock (no lease in it); if no run uses "
                             f"'{self.out}', delete it")
        return data

    def _in_use(self, holder: dict[str, Any]) -> RaylmError:
        expires = holder.get("expires")
        left = f" (in {max(0, math.ceil(expires - time.time()))} s)" if isinstance(expires, (int, float)) else ""
        return RaylmError(f"output directory '{self.out}' is in use by another raylm run ({describe(holder)}); "
                          f"wait for it to finish, or for its lease to expire{left} if it no longer runs, or use "
                          "another --output")


def _expired(holder: dict[str, Any]) -> bool:
    return holder["expires"] <= time.time()
