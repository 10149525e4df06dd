"""The bubblewrap (`bwrap`) command line a program runs under, and whether this node can run it.

bubblewrap makes the sandbox without root, daemon or setuid binary: unprivileged user namespaces give the program
its own mounts (read-only Python, a size-capped scratch tmpfs), no network, its own PIDs (so every descendant dies
with it) and a cleared environment, at the cost of one exec per program.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys

BWRAP = "bwrap"
NOBODY = 65534
SCRATCH = "/tmp"
PATH = "/usr/local/bin:/usr/bin:/bin"
# What Python and the C library read from /etc: the loader's cache, the time zone, user and group names.
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
       "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")


def python_dirs() -> list[str]:
    """The interpreter's folders, as the sandbox must see them: the environment (a venv's symlinks and pyvenv.cfg)
    and the installation its interpreter really lives in, each at its own path; none nested in another or in
    /usr, which is bound whole."""
    candidates = {sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix, os.path.realpath(sys.base_prefix),
                  os.path.dirname(os.path.realpath(sys.executable))}
    dirs: list[str] = []
    for path in sorted(candidates, key=len):
        if not any(path == kept or path.startswith(kept + "/") for kept in ["/usr", *dirs]):
            dirs.append(path)
    return dirs


def reachable_by_others(path: str) -> bool:
    """Whether a user who owns nothing can reach `path`: every folder on the way searchable by others."""
    parts = path.rstrip("/").split("/")
    return all(os.stat("/".join(parts[:i]) or "/").st_mode & stat.S_IXOTH for i in range(1, len(parts) + 1))


@functools.cache
def sandbox_user() -> int | None:
    """The user bwrap runs as: the caller's own (None), except root's, which the kernel exempts from RLIMIT_NPROC:
    then nobody, where nobody can reach the interpreter's folders (else root, whose programs no process count
    limits)."""
    if os.geteuid() != 0 or not all(reachable_by_others(path) for path in python_dirs()):
        return None
    return NOBODY


def system_binds() -> list[str]:
    """Read-only /usr and the /etc files Python needs; /bin, /lib... as the symlinks into /usr they are on a merged
    /usr system, or bound where they are folders."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ETC:
        args += ["--ro-bind-try", path, path]
    return args


def bwrap_command(scratch_bytes: int, env: dict[str, str], info_fd: int | None = None) -> list[str]:
    """bwrap and its options, to be followed by the command: every namespace its own (network, PIDs, IPC, UTS, user,
    cgroup), read-only system and Python folders, a fresh size-capped tmpfs as /tmp, the cwd and HOME, and nothing
    else writable (/ and /dev read-only)."""
    args = [shutil.which(BWRAP) or BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--clearenv", *system_binds(),
            "--dev", "/dev", "--proc", "/proc", "--size", str(scratch_bytes), "--tmpfs", SCRATCH]
    for path in python_dirs():  # after the scratch tmpfs, which would hide a Python environment under /tmp
        args += ["--ro-bind", path, path]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SCRATCH]
    for name, value in env.items():
        args += ["--setenv", name, value]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args


@functools.cache
def sandbox_unavailable() -> str | None:
    """None where this node can run a sandboxed program; else one line saying why. A trial sandbox runs the
    interpreter once, so a node that lacks bwrap or refuses user namespaces is found before the first program."""
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        return ("code execution needs bubblewrap (`apt-get install bubblewrap`) on every node that runs programs; "
                "--confirm_run_unsafe_code runs them unsandboxed")
    user = sandbox_user()
    trial = subprocess.run([*bwrap_command(1 << 20, {"PATH": PATH}), sys.executable, "-I", "-c", "pass"], check=False,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                           user=user, group=user, extra_groups=[] if user is not None else None)
    if trial.returncode == 0:
        return None
    error = (trial.stderr.strip().splitlines() or [f"exit status {trial.returncode}"])[-1]
    return (f"bubblewrap cannot make a sandbox on this node ({error}): unprivileged user namespaces must be allowed "
            "(docs/sandbox.md says how); --confirm_run_unsafe_code runs programs unsandboxed")
