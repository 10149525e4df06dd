"""Run one untrusted generated program (a HumanEval or MBPP completion with its tests) and say how it ended.

A program runs in a process of its own, under bubblewrap (see bubblewrap.py) unless the caller chose to run code
unsandboxed, with the same rlimits, cleared environment and wall-time kill either way. It passes as lm-eval's code
metric counts a pass: its exec returns without an exception (launcher.py runs it so).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from raylm.errors import RaylmError
from raylm.sandbox.bubblewrap import PATH, SCRATCH, bwrap_command, sandbox_unavailable, sandbox_user

__all__ = ["Limits", "Outcome", "run_program", "sandbox_unavailable"]

log = logging.getLogger(__name__)

LAUNCHER = (Path(__file__).parent / "launcher.py").read_bytes()
# The interpreter's first code: launcher.py's text, whose length it is given, comes first on stdin (the sandbox does
# not see raylm's checkout, and as `-c` text it would fill every process listing), then the program's source.
BOOTSTRAP = "import sys; n = int(sys.argv.pop(1)); exec(compile(sys.stdin.buffer.read(n), 'launcher.py', 'exec'))"
OUTPUT_BYTES = 64 << 10  # the tail of a program's output kept, to name how it died where the launcher could not
STARTUP_S = 30.0  # the most a sandbox may take to start before the wall time starts counting (a busy node)
REAP_S = 10.0  # the most the sandbox's teardown may take once its processes are killed
# Libraries that start a thread per core reserve address space per thread, which RLIMIT_AS counts.
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Limits:
    wall_s: float = 3.0  # HF evaluate's code_eval default timeout per program
    cpu_s: int = 3  # RLIMIT_CPU
    memory_bytes: int = 2 << 30  # RLIMIT_AS
    processes: int = 64  # RLIMIT_NPROC inside the sandbox's own user namespace
    scratch_bytes: int = 64 << 20  # size of the per-program scratch tmpfs (and RLIMIT_FSIZE)


@dataclass(frozen=True)
class Outcome:
    status: str  # exactly one of "passed", "failed", "timed out", "killed by a limit"
    detail: str  # "" when passed; the exception's last line; or which limit ("memory", "cpu time", "processes", ...)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class _Run:
    """What a program's process left on its pipes."""

    result: bytearray
    output: bytearray
    info: bytearray
    timed_out: bool = False


def run_program(source: str, limits: Limits = Limits(), sandboxed: bool = True) -> Outcome:
    """Run `source` as check_correctness would, in a process of its own; sandboxed, under bubblewrap, which this
    node must be able to run (sandbox_unavailable())."""
    if sandboxed and (reason := sandbox_unavailable()) is not None:
        raise RaylmError(reason)
    result_r, result_w = os.pipe()
    info_r, info_w = os.pipe() if sandboxed else (None, None)
    workdir = contextlib.nullcontext("/") if sandboxed else tempfile.TemporaryDirectory(prefix="raylm-program-")
    try:
        with workdir as cwd:
            home = SCRATCH if sandboxed else cwd
            env = {"PATH": PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", **THREADS}
            # unsandboxed, RLIMIT_NPROC counts every process of the caller's user: allow that many more
            processes = limits.processes + (0 if sandboxed or os.geteuid() == 0 else _tasks_of(os.getuid()))
            launcher = [sys.executable, "-I", "-c", BOOTSTRAP, str(len(LAUNCHER)), str(result_w), str(limits.cpu_s),
                        str(limits.memory_bytes), str(processes), str(limits.scratch_bytes)]
            user = sandbox_user() if sandboxed else None
            command = [*bwrap_command(limits.scratch_bytes, env, info_w), *launcher] if sandboxed else launcher
            try:
                proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, bufsize=0, cwd=cwd, env=env, start_new_session=True,
                                        pass_fds=[fd for fd in (result_w, info_w) if fd is not None],
                                        user=user, group=user, extra_groups=[] if user is not None else None)
            finally:  # the program's copies alone stay open, so the pipes end when its processes do
                for fd in (result_w, info_w):
                    if fd is not None:
                        os.close(fd)
            run = _watch(proc, source, limits, result_r, info_r)
    finally:
        for fd in (result_r, info_r):
            if fd is not None:
                os.close(fd)
    return _outcome(run, proc.returncode, sandboxed)


def _watch(proc: subprocess.Popen, source: str, limits: Limits, result_r: int, info_r: int | None) -> _Run:
    """Feed the program its source, read its pipes until it exits or its time is up, then kill every process it
    left and wait until they are gone."""
    run = _Run(bytearray(), bytearray(), bytearray())
    data = memoryview(LAUNCHER + source.encode())
    try:
        while data:
            data = data[proc.stdin.write(data):]
    except BrokenPipeError:
        pass  # it died before reading its source (bwrap refused): its output says why
    proc.stdin.close()
    pidfd = os.pidfd_open(proc.pid)
    sandbox_pidfd = None  # the sandbox's PID 1: its exit is the end of every process in the sandbox
    buffers = {proc.stdout.fileno(): run.output, result_r: run.result}
    if info_r is not None:
        buffers[info_r] = run.info
    selector = selectors.DefaultSelector()
    for fd in (pidfd, *buffers):
        selector.register(fd, selectors.EVENT_READ)
    deadline, started = time.monotonic() + STARTUP_S + limits.wall_s, False
    try:
        try:
            exited = False
            while not exited:
                left = deadline - time.monotonic()
                if left <= 0:
                    run.timed_out = True
                    break
                for key, _ in selector.select(left):
                    if key.fd == pidfd:
                        exited = True
                    elif not _read(key.fd, buffers[key.fd]):
                        selector.unregister(key.fd)
                if not started and run.result.startswith(b"started\n"):
                    started, deadline = True, time.monotonic() + limits.wall_s
                if sandbox_pidfd is None and not exited and run.info.rstrip().endswith(b"}"):
                    sandbox_pidfd = _open_child(proc.pid, json.loads(run.info)["child-pid"])
        finally:
            _kill(proc, sandbox_pidfd)
        for fd, buffer in buffers.items():
            os.set_blocking(fd, False)
            while _read(fd, buffer):
                pass
    finally:
        selector.close()
        os.close(pidfd)
        if sandbox_pidfd is not None:
            os.close(sandbox_pidfd)
        proc.stdout.close()
    return run


def _read(fd: int, buffer: bytearray) -> bool:
    """Append what the pipe holds; keep only the last OUTPUT_BYTES. False at its end."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    buffer += data
    del buffer[:-OUTPUT_BYTES]
    return bool(data)


def _open_child(parent: int, pid: int) -> int | None:
    """A pidfd of `pid` while it is still `parent`'s child (bwrap's PID 1, not a process that reused its PID)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # it has ended already, and its PID namespace with it
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # it has ended already (and been reaped)
        stat = ""
    if not stat or int(stat[stat.rindex(")") + 2:].split()[1]) != parent:
        os.close(pidfd)
        return None
    return pidfd


def _kill(proc: subprocess.Popen, sandbox_pidfd: int | None) -> None:
    """SIGKILL the program's process group, and the sandbox's PID 1, whose end the kernel makes the end of every
    process in the sandbox (a double-forked child in a session of its own too); return once they are gone, so that
    nothing a program started outlives run_program."""
    if sandbox_pidfd is not None:
        try:
            signal.pidfd_send_signal(sandbox_pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it has ended: nothing is left to kill
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group has ended: nothing is left to kill
    proc.wait()
    if sandbox_pidfd is not None:
        with selectors.DefaultSelector() as waiting:
            waiting.register(sandbox_pidfd, selectors.EVENT_READ)
            gone = bool(waiting.select(REAP_S))
    else:  # the launcher's orphans die as init reaps them: wait until none of the group is running
        deadline = time.monotonic() + REAP_S
        while (gone := not _running_in_group(proc.pid)) is False and time.monotonic() < deadline:
            time.sleep(0.005)
    if not gone:
        log.warning("a program's processes (group %s) outlived SIGKILL by %s s", proc.pid, REAP_S)


def _proc_files(name: str) -> Iterator[str]:
    """/proc/<pid>/<name> of every process, but those that end while it is read."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                yield Path(entry.path, name).read_text()
            except OSError:  # it ended while it was read
                continue


def _running_in_group(pgid: int) -> bool:
    """Whether a process of the group is still running (a zombie no longer runs)."""
    for stat in _proc_files("stat"):
        state, _, group = stat[stat.rindex(")") + 2:].split()[:3]
        if int(group) == pgid and state != "Z":
            return True
    return False


def _tasks_of(uid: int) -> int:
    """The tasks (threads too) RLIMIT_NPROC counts for this user now."""
    count = 0
    for status in _proc_files("status"):
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def _outcome(run: _Run, returncode: int, sandboxed: bool) -> Outcome:
    """How the program ended: the launcher's own report where it made one, else the time limit, the signal that
    killed it, or the last line it printed."""
    lines = run.result.decode(errors="replace").splitlines()
    final = lines[-1] if lines and lines[-1] != "started" else ""
    if final == "passed":
        return Outcome("passed", "")
    if final.startswith("failed\t"):
        _, kind, line = final.split("\t", 2)
        return Outcome("killed by a limit", kind) if kind else Outcome("failed", line)
    if run.timed_out:
        return Outcome("timed out", "wall time")
    output = [line for line in run.output.decode(errors="replace").splitlines() if line.strip()]
    if sandboxed and not lines and output and output[-1].startswith("bwrap:"):
        raise RaylmError(f"bubblewrap could not start a program's sandbox: {output[-1]}")
    # bwrap exits 128 + the signal that killed the program; a process of our own reports minus the signal
    killed_by = -returncode if returncode < 0 else returncode - 128 if sandboxed and returncode > 128 else 0
    if killed_by == signal.SIGXCPU:
        return Outcome("killed by a limit", "cpu time")
    if killed_by == signal.SIGXFSZ:
        return Outcome("killed by a limit", "file size")
    if killed_by:
        return Outcome("failed", f"killed by {signal.Signals(killed_by).name}")
    return Outcome("failed", output[-1] if output else f"exited with status {returncode} before it finished")

