"""The first code that runs inside a program's process: it sets the limits, then runs the program as lm-eval's code
metric (HF evaluate's code_eval, check_correctness) does, and reports how it ended on a pipe of its own.

The limits are set here, inside the sandbox, and not on bwrap: RLIMIT_NPROC counts the processes of one user in one
user namespace, so set outside it would count every process of the caller's user. The program is run as
check_correctness runs it, so that a program passes here exactly where it passes there: exec'd in fresh globals (so
`__name__` is not "__main__"), stdin unreadable, and the same functions disabled (its reliability_guard: os.fork,
os.kill, subprocess.Popen, exit(), ...). It passes when the exec returns; an exception, SystemExit included, fails it.

This file is stdlib-only and reaches the interpreter on stdin (programs.BOOTSTRAP): the sandbox does not see raylm's
checkout. argv: result_fd cpu_s memory_bytes processes file_bytes; the program's source follows this file on stdin.
"""

import builtins
import errno
import os
import resource
import shutil
import subprocess
import sys


class _Unreadable:
    """check_correctness's stdin: reading it raises, so input() fails the program instead of waiting for the time
    limit."""

    def _refuse(self, *args, **kwargs):
        raise OSError("stdin is not readable")

    read = readline = readlines = __iter__ = __next__ = _refuse

    def readable(self) -> bool:
        return False


# The audit events of the calls that start a process: a fork that fails with EAGAIN just after one of them met the
# process-count limit (or the kernel's own), not a busy non-blocking file.
SPAWNS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"}
recent = {"event": ""}


def remember(event: str, args: tuple) -> None:
    recent["event"] = event


def limit_hit(error: BaseException) -> str:
    """Which limit an exception is the mark of, or "" where it is the program's own failure."""
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, OSError) and error.errno in (errno.EFBIG, errno.ENOSPC):
        return "file size"
    if isinstance(error, OSError) and error.errno == errno.EAGAIN and recent["event"] in SPAWNS:
        return "processes"
    if isinstance(error, RuntimeError) and "can't start new thread" in str(error):  # threads count as processes
        return "processes"
    return ""


def last_line(error: BaseException) -> str:
    """The traceback's last line, as Python prints it."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1]}" if text else type(error).__name__


def guard() -> None:
    """check_correctness's reliability_guard (OpenAI's human-eval), without its memory limit, which code_eval does
    not set: what it disables fails a program there, so it fails it here too."""
    os.environ["OMP_NUM_THREADS"] = "1"
    builtins.exit = None
    builtins.quit = None
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
                 "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
                 "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def main() -> None:
    result_fd, cpu_s, memory_bytes, processes, file_bytes = map(int, sys.argv[1:6])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU, then SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    source = sys.stdin.buffer.read().decode()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = _Unreadable()
    main_pid = os.getpid()

    def report(line: str) -> None:
        """Only the program's first process speaks: a forked child leaving the exec reaches here too."""
        if os.getpid() == main_pid:
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(result_fd, line.encode() + b"\n")
        os._exit(0 if line == "passed" else 1)

    guard()
    sys.addaudithook(remember)
    os.write(result_fd, b"started\n")
    try:
        exec(compile(source, "program.py", "exec"), {})  # noqa: S102 -- running the program is this file's job
    except BaseException as error:  # noqa: BLE001 -- check_correctness fails a program on any exception
        kind = limit_hit(error)
        report(f"failed\t{kind}\t{last_line(error)}".replace("\n", " "))
    report("passed")


if __name__ == "__main__":
    main()
