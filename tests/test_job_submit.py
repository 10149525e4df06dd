"""CLUSTER TEST (~60 s): a real `ray start --head` on loopback, then `ray job submit --working-dir` running
`raylm eval --demo` on it, as a user would on a cluster.

It checks the job succeeds, its results.json matches scoring in-process, and the driver attached to
that cluster (RAY_ADDRESS, set by the job server) rather than starting its own. The head runs in its own
process group, which is killed afterwards; `ray stop` is never used, since it would stop every Ray on the
machine. Deselect with `-m "not cluster"`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from raylm.cluster.actors import score_shard
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.requests.encoding import Encoder, resolve_max_length
from raylm.config import EvalConfig
from raylm.evaluate import build_task_requests
from raylm.scoring.models import ModelSpec, load_model, load_tokenizer
from raylm.scoring.scorer import Scorer

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
PORT_FLAGS = ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
              "metrics-export-port", "node-manager-port", "object-manager-port", "ray-client-server-port",
              "runtime-env-agent-port")
STARTUP_S = 90
SHUTDOWN_S = 10
RAY = str(Path(sys.executable).parent / "ray")  # the CLI installed beside this Python, whatever PATH says


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env() -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def ray_head(temp_dir: Path) -> Iterator[tuple[str, int]]:
    """A head node on its own ports (so it cannot collide with other Rays here) and in its own process group.

    The job server lives in the dashboard process, so the dashboard is included.
    """
    ports = {flag: free_port() for flag in PORT_FLAGS}
    command = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
               "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--temp-dir", str(temp_dir),
               "--object-store-memory", str(128 * 1024**2), "--disable-usage-stats",
               *(arg for flag, port in ports.items() for arg in (f"--{flag}", str(port)))]
    log = open(temp_dir / "ray-start.log", "w")
    head = subprocess.Popen(command, env=cluster_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2).read()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray start failed:\n{(temp_dir / 'ray-start.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield address, ports["port"]
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()


def raylets_under(temp_dir: Path) -> int:
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # processes exit while we look
            args = cmdline.read_bytes().split(b"\0")
            count += bool(args and args[0].endswith(b"/raylet") and str(temp_dir).encode() in b" ".join(args))
    return count


def test_ray_job_submit_attaches_and_writes_results(tmp_path):
    temp_dir = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray's socket paths must stay short
    working_dir = tmp_path / "job"
    shutil.copytree(REPO / "raylm", working_dir / "raylm", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    try:
        with ray_head(temp_dir) as (address, gcs_port):
            proc = subprocess.run(
                [RAY, "job", "submit", "--address", address, "--working-dir", str(working_dir), "--",
                 sys.executable, "-m", "raylm", "eval", "--demo", "--limit", "5", "--output", str(out),
                 "--no-progress"],
                env=cluster_env(), capture_output=True, text=True, timeout=240)
            assert proc.returncode == 0 and "succeeded" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
            assert raylets_under(temp_dir) == 1
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["ray_gcs_address"].endswith(f":{gcs_port}")
    assert results["n-samples"]["hellaswag"] == {"original": 300, "effective": 5}
    for name in ("hellaswag", "winogrande"):
        assert results["sums"][name] == sums_in_process(name, limit=5)


def sums_in_process(task: str, limit: int) -> dict[str, float]:
    """The same task scored here, without Ray: what the job's actors must have produced."""
    spec = ModelSpec(str(DEMO_MODEL))
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, (task,), DEMO_DATA, limit=limit), encoder)
    kind, table = tables[task]
    return score_shard(Scorer(model, encoder.max_length), kind, table).sums
