"""One writer per output directory: a second run there stops at once naming the first; a dead run's lock is taken
over; within one process the lock is re-entrant per thread."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from raylm.cli import main
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.errors import RaylmError
from raylm.storage import lock
from raylm.storage.lock import LOCK_FILE, output_lock

REPO = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time\n"
        "from pathlib import Path\n"
        "from raylm.storage.lock import output_lock\n"
        "with output_lock(Path(sys.argv[1])):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(120)\n")


@pytest.fixture
def held(tmp_path):
    """tmp_path/out locked by another process, as a run in another shell holds it."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), "eval", "--model", "m"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield out, proc
    proc.kill()
    proc.wait()


def test_a_second_run_stops_at_once_naming_the_holder_and_a_dead_holders_lock_is_taken_over(held, caplog):
    out, proc = held
    with pytest.raises(RaylmError) as raised:
        with output_lock(out):
            pass
    message = str(raised.value)
    assert message.startswith(f"output directory '{out}' is in use by another raylm run (pid {proc.pid} on "
                              f"{socket.gethostname()}, `-c {out} eval --model m`, since ")
    assert "\n" not in message
    proc.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops its flock, its details stay in the file
    proc.wait()
    with caplog.at_level(logging.WARNING), output_lock(out):
        assert str(os.getpid()) in (out / LOCK_FILE).read_text()
    assert f"last held by a run that did not finish (pid {proc.pid} on" in caplog.text
    assert (out / LOCK_FILE).read_text() == ""  # a clean finish leaves nothing to take over
    caplog.clear()
    with caplog.at_level(logging.WARNING), output_lock(out):
        pass
    assert "did not finish" not in caplog.text


def test_reentrant_in_one_thread_refused_in_another(tmp_path):
    errors = []

    def other_thread():
        try:
            with output_lock(tmp_path):
                pass
        except RaylmError as e:
            errors.append(str(e))

    with output_lock(tmp_path):
        with output_lock(tmp_path):  # `raylm eval` around evaluate(), which takes it again
            pass
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert len(errors) == 1 and f"pid {os.getpid()}" in errors[0]
    with output_lock(tmp_path):  # released once the outer block ended
        pass


@pytest.mark.parametrize("command", ["eval", "sweep", "ppl", "kl", "probe", "contamination", "membership"])
def test_every_command_that_writes_stops_before_any_work(held, command, tmp_path, capsys):
    out, proc = held
    text = tmp_path / "corpus.txt"
    text.write_text("Once upon a time.\n")
    args = {"eval": ["eval", "--demo"],
            "sweep": ["sweep", str(REPO / "jobs" / "demo.yaml")],
            "ppl": ["ppl", "--model", str(DEMO_MODEL), "--data", str(text)],
            "kl": ["kl", "--model", str(DEMO_MODEL), "--model-b", str(DEMO_MODEL), "--data", str(text)],
            "probe": ["probe", "--model", str(DEMO_MODEL), "--probes",
                      str(REPO / "docs" / "masked-lm" / "probes.yaml")],
            "contamination": ["contamination", "--tasks", "winogrande", "--data-dir", str(DEMO_DATA), "--corpus",
                              str(text)],
            "membership": ["membership", "--model", str(DEMO_MODEL), "--tasks", "winogrande", "--data-dir",
                           str(DEMO_DATA)],
            }[command]
    assert main([*args, "--output", str(out)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[-1].startswith(f"raylm: error: output directory '{out}' is in use by another raylm run "
                                 f"(pid {proc.pid} "), errors
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written
    assert DEMO_DATA.is_dir()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "2", "inf", "nan", "1e11", "86401"])
def test_a_lease_length_that_cannot_work_is_one_line_naming_the_variable(value, tmp_path, monkeypatch):
    """0 would renew without pause, a lease shorter than the wait before its first renewal would expire while its
    holder runs, and 1e11 s is more than the renewer's wait can take (it died with an OverflowError)."""
    monkeypatch.setenv(lock.LEASE_ENV, value)
    with pytest.raises(RaylmError, match=rf"^RAYLM_LOCK_LEASE_S='{value}' is not a lease length: give seconds, from "
                                         r"3 to 86400$"):
        with output_lock(tmp_path):
            pass
