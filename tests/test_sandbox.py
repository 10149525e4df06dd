"""The sandbox for generated programs: each guarantee docs/sandbox.md gives, shown by a program that tries to break it.

A program passes as lm-eval's code metric counts a pass; under bubblewrap it has no network, writes only to its own
scratch tmpfs, sees none of the caller's environment or files, is held to its limits, and takes every process it
started with it when it ends.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import require_sandbox

from raylm.errors import RaylmError
from raylm.sandbox.bubblewrap import sandbox_unavailable, sandbox_user
from raylm.sandbox.programs import Limits, Outcome, run_program

REPO = Path(__file__).resolve().parents[1]
QUICK = Limits(wall_s=2)

REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)


@pytest.fixture(autouse=True)
def sandbox(request):
    """Every test but those that fake a node of their own runs programs in the sandbox: where this node cannot make
    one the test skips, saying why, except where CI=true (.ci/run installs bubblewrap), where it fails."""
    if "fresh_check" not in request.fixturenames:
        require_sandbox()


@pytest.fixture
def fresh_check():
    """sandbox_unavailable() is cached per process: a test that changes what it sees asks again, before and after."""
    sandbox_unavailable.cache_clear()
    yield
    sandbox_unavailable.cache_clear()


def processes_with(marker: str) -> list[str]:
    """Every process on this machine whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:  # it ended while it was read
            continue
        if marker.encode() in cmdline:
            found.append(f"{entry.name}: {cmdline!r}")
    return found


@pytest.mark.parametrize("source,outcome", [
    ("def add(a, b):\n    return a + b\nassert add(1, 2) == 3", Outcome("passed", "")),
    ("assert 1 + 1 == 3", Outcome("failed", "AssertionError")),
    ("print(undefined)", Outcome("failed", "NameError: name 'undefined' is not defined")),
    # as code_eval's check_correctness: an exit is an exception, the source is exec'd (not run as __main__), and
    # stdin cannot be read
    ("import sys\nsys.exit(0)\nassert False", Outcome("failed", "SystemExit: 0")),
    ("if __name__ == '__main__':\n    raise SystemExit(1)", Outcome("passed", "")),
    ("input()", Outcome("failed", "OSError: stdin is not readable")),
], ids=["passes", "assertion", "name error", "exit", "main block", "input"])
def test_a_program_passes_as_the_code_metric_counts_a_pass(source, outcome):
    assert run_program(source, QUICK) == outcome


def test_the_program_has_no_network():
    """Not the internet, and not this machine's own listening port either: its loopback is its own."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        source = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        assert run_program(source, QUICK).status == "failed"
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()
    outcome = run_program("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)", QUICK)
    assert outcome == Outcome("failed", "OSError: [Errno 101] Network is unreachable")


def test_a_program_writes_nowhere_but_its_own_scratch(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    name = f"raylm-sandbox-test-{uuid.uuid4().hex}"
    targets = [home / name, Path("/tmp") / name, REPO / name, REAL_HOME / name]
    source = (f"import os\nfor path in {[str(t) for t in targets]!r}:\n"
              "    try:\n"
              "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
              "        with open(path, 'w') as file:\n"
              "            file.write('escaped')\n"
              "    except OSError:\n"
              "        pass\n"
              f"assert not os.path.exists({str(REPO / 'pyproject.toml')!r}), 'the working tree is visible'\n"
              "with open(os.path.join(os.environ['HOME'], 'scratch'), 'w') as file:\n"
              "    file.write('the scratch folder is writable')")
    assert run_program(source, QUICK) == Outcome("passed", "")
    assert not [target for target in targets if target.exists()]


def test_a_program_sees_none_of_the_callers_environment_or_credentials(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = caller-secret\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-secret")
    source = ("import os\n"
              "assert 'AWS_SECRET_ACCESS_KEY' not in os.environ, 'the environment leaks'\n"
              "assert os.environ['HOME'] == '/tmp', os.environ['HOME']\n"
              f"assert not os.path.exists({str(home / '.aws' / 'credentials')!r}), 'the credentials are visible'\n"
              "assert not [p for p in os.listdir('/proc') if p.isdigit() and b'caller-secret' in\n"
              "            open(f'/proc/{p}/environ', 'rb').read()], 'a process environment leaks'")
    assert run_program(source, QUICK) == Outcome("passed", "")


@pytest.mark.parametrize("source,limits,outcome", [
    ("x = bytearray(6 << 30)", QUICK, Outcome("killed by a limit", "memory")),
    ("while True:\n    pass", Limits(wall_s=20, cpu_s=1), Outcome("killed by a limit", "cpu time")),
    ("with open('big', 'wb') as file:\n    file.write(b'x' * (2 << 20))", Limits(wall_s=2, scratch_bytes=1 << 20),
     Outcome("killed by a limit", "file size")),
    ("while True:\n    pass", Limits(wall_s=1), Outcome("timed out", "wall time")),
    ("import time\ntime.sleep(1000)", Limits(wall_s=1), Outcome("timed out", "wall time")),
    # output is read as it comes and only its tail kept: a program printing forever fills no memory
    ("while True:\n    print('x' * 10000)", Limits(wall_s=1), Outcome("timed out", "wall time")),
], ids=["memory", "cpu time", "file size", "busy loop", "sleep", "endless output"])
def test_a_program_is_held_to_its_limits(source, limits, outcome):
    assert run_program(source, limits) == outcome


def interpreter_the_process_limit_binds() -> str:
    """RLIMIT_NPROC binds every user but root, so under root the sandbox runs as nobody, which needs an interpreter
    nobody can reach: this one, or else the system's."""
    if os.geteuid() != 0 or sandbox_user() is not None:
        return sys.executable
    if not Path("/usr/bin/python3").exists():
        pytest.skip("root's processes are not counted by RLIMIT_NPROC, and nobody can reach this interpreter")
    return "/usr/bin/python3"


def test_a_fork_bomb_is_held_to_the_process_limit():
    """posix.fork, which check_correctness's guard does not disable as it does os.fork."""
    probe = ("from raylm.sandbox.programs import Limits, run_program\n"
             "print(run_program('import posix\\nwhile True:\\n    posix.fork()', Limits(wall_s=5, processes=16)))\n"
             "print(run_program('pass', Limits(wall_s=5)))")
    proc = subprocess.run([interpreter_the_process_limit_binds(), "-c", probe], check=False, capture_output=True,
                          text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    expected = [repr(Outcome("killed by a limit", "processes")), repr(Outcome("passed", ""))]
    assert proc.stdout.splitlines() == expected, proc.stderr[-2000:]


@pytest.mark.parametrize("ending,limits,status", [("", QUICK, "passed"),
                                                  ("while True:\n    pass", Limits(wall_s=1), "timed out")],
                         ids=["passes", "times out"])
def test_every_process_a_program_started_ends_with_it(ending, limits, status):
    """A grandchild in a session of its own, which a process-group kill misses: the sandbox's PID namespace ends."""
    marker = f"raylm-sandbox-test-{uuid.uuid4().hex}"
    source = ("import os, posix\n"
              "if posix.fork() == 0:\n"
              "    os.setsid()\n"
              "    if posix.fork() == 0:\n"
              f"        os.execv('/bin/sleep', [{marker!r}, '1000'])\n"
              "    posix._exit(0)\n"
              "import time\n"
              f"time.sleep(0.2)\n{ending}")
    assert run_program(source, limits).status == status
    assert not processes_with(marker)


@pytest.mark.parametrize("kill", ["posix.kill(posix.getppid(), 9)", "posix.kill(-1, 9)"], ids=["parent", "all"])
def test_a_program_that_kills_its_parent_or_every_process_harms_only_itself(kill):
    """The first line is a safety catch: outside a PID namespace of its own the program fails before it kills."""
    source = (f"import posix\nassert posix.getpid() < 10, 'not in a PID namespace'\ntry:\n    {kill}\n"
              "except ProcessLookupError:\n    pass  # nothing else in the sandbox to kill\nraise ValueError('alive')")
    assert run_program(source, QUICK) == Outcome("failed", "ValueError: alive")
    assert run_program("pass", QUICK).passed


def test_unsandboxed_a_program_still_has_its_limits_and_a_cleared_environment(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-secret")
    source = ("import os\n"
              "assert 'AWS_SECRET_ACCESS_KEY' not in os.environ, 'the environment leaks'\n"
              f"assert os.environ['HOME'] != {os.environ.get('HOME', '')!r}, 'HOME is the caller s'\n"
              "x = bytearray(6 << 30)")
    assert run_program(source, QUICK, sandboxed=False) == Outcome("killed by a limit", "memory")
    marker = f"raylm-sandbox-test-{uuid.uuid4().hex}"
    source = ("import os, posix\n"
              "if posix.fork() == 0:\n"
              f"    os.execv('/bin/sleep', [{marker!r}, '1000'])\n"
              "while True:\n"
              "    pass")
    assert run_program(source, Limits(wall_s=1), sandboxed=False) == Outcome("timed out", "wall time")
    assert not processes_with(marker)


def test_a_node_without_bubblewrap_says_how_to_install_it(tmp_path, monkeypatch, fresh_check):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = sandbox_unavailable()
    assert reason is not None and "apt-get install bubblewrap" in reason and "--confirm_run_unsafe_code" in reason
    with pytest.raises(RaylmError, match="apt-get install bubblewrap"):
        run_program("pass", QUICK)


def test_a_node_that_refuses_user_namespaces_quotes_bubblewrap(tmp_path, monkeypatch, fresh_check):
    refusal = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow it"
    bwrap = tmp_path / "bwrap"
    bwrap.write_text(f"#!/bin/sh\necho '{refusal}' >&2\nexit 1\n")
    bwrap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    reason = sandbox_unavailable()
    assert reason is not None and refusal in reason and "user namespaces must be allowed" in reason


def test_a_python_environment_under_tmp_is_seen_through_the_scratch_tmpfs(tmp_path):
    """The sandbox's /tmp is its own tmpfs; a virtual environment that lives under the caller's /tmp (as CI's does)
    is bound after it, so the interpreter is still there."""
    venv = Path("/tmp") / f"raylm-sandbox-venv-{uuid.uuid4().hex}"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                       check=True)
        probe = ("import sys; from raylm.sandbox.programs import run_program, Limits; "
                 "print(sys.prefix, run_program('import sys; assert sys.prefix == %r' % sys.prefix, Limits(wall_s=5)))")
        ran = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    finally:
        subprocess.run(["rm", "-rf", str(venv)], check=True)
    assert ran.stdout.split() == [str(venv), "Outcome(status='passed',", "detail='')"], ran.stderr[-2000:]
