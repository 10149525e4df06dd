"""CLUSTER TEST (~2 min): a real `ray start --head` on loopback and a second node from `ray start --address`, both
run by a Python that has Ray, torch, transformers and lm-eval but not raylm, with Ray's token authentication on,
then `ray job submit --working-dir . --runtime-env jobs/runtime-env.yaml -- raylm eval --demo` with the token, as
a user would on a shared cluster where nothing can be pre-installed.

It checks the job succeeds, the runtime environment installed the checkout on both nodes, an actor ran on each,
its results.json matches scoring in-process, and the driver attached to that cluster (RAY_ADDRESS, set by the job
server) rather than starting its own. Each node runs in its own process group, which is killed afterwards;
`ray stop` is never used, since it would stop every Ray on the machine. Deselect with `-m "not cluster"`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
from task_requests import build_task_requests

from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.scoring.scorer import Scorer

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
RUNTIME_ENV = REPO / "jobs" / "runtime-env.yaml"
NODE_PORT_FLAGS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                   "node-manager-port", "object-manager-port", "runtime-env-agent-port")
PORT_FLAGS = ("port", "dashboard-port", "ray-client-server-port", *NODE_PORT_FLAGS)
STARTUP_S = 90
SHUTDOWN_S = 10
RAY = str(Path(sys.executable).parent / "ray")  # the CLI installed beside this Python, whatever PATH says


def cluster_env(auth: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without RAY_ADDRESS; with token authentication disabled, or, given `auth`, with Ray's
    authentication variables (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH) exactly as `auth` sets them."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("RAY_AUTH_")}
    return {**env, **(auth if auth is not None else {"RAY_AUTH_MODE": "disabled"})}


def python_without_raylm(root: Path) -> Path:
    """A virtual environment that sees this one's packages (Ray, torch, transformers, lm-eval) but not raylm.

    A .pth file in it names this environment's site-packages. Python adds a .pth file's path lines to sys.path
    but reads .pth files only in site directories, so the .pth there that installs raylm's editable finder never
    runs. Ray's pip runtime env clones this environment per job, and the clone is as small as it is."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)}))
    here = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site_packages / "this-environment.pth").write_text("".join(f"{path}\n" for path in here))
    return root / "bin" / "python"


def node_env(python: Path, auth: dict[str, str] | None = None) -> dict[str, str]:
    """cluster_env(auth) for nodes run by `python`: no PYTHONPATH, and on PATH only its bin and the system's, so no
    `raylm` of this environment can reach a job."""
    env = {k: v for k, v in cluster_env(auth).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": os.pathsep.join([str(python.parent), "/usr/local/bin", "/usr/bin", "/bin"])}


def ray_node(args: list[str], temp_dir: Path, ports: dict[str, int], ready: Callable[[], bool],
             env_extra: dict[str, str] | None = None, python: Path | None = None,
             auth: dict[str, str] | None = None) -> contextlib.AbstractContextManager[None]:
    """`ray start --block ARGS` on its own ports and in its own process group (setsid), once ready() says it is up.
    With `python`, that Python runs the node (and so its workers), in node_env(python); `auth` as cluster_env's."""
    ray = [RAY] if python is None else [str(python), "-m", "ray.scripts.scripts"]
    command = [*ray, "start", "--block", "--node-ip-address", "127.0.0.1", "--temp-dir", str(temp_dir),
               "--object-store-memory", str(128 * 1024**2), "--disable-usage-stats", *args,
               *(arg for flag, port in ports.items() for arg in (f"--{flag}", str(port)))]
    env = cluster_env(auth) if python is None else node_env(python, auth)
    return _running(command, temp_dir / "ray-start.log", ready, {**env, **(env_extra or {})})


@contextlib.contextmanager
def _running(command: list[str], log_path: Path, ready: Callable[[], bool], env: dict[str, str]) -> Iterator[None]:
    log = open(log_path, "w")
    node = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not ready():
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # a node that failed to start may have no group left
            os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        log.close()


def _answers(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2).read()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def ray_head(temp_dir: Path, num_cpus: int = 2, ports: dict[str, int] | None = None, extra_args: tuple[str, ...] = (),
             env_extra: dict[str, str] | None = None, python: Path | None = None,
             auth: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """A head node on its own ports (so it cannot collide with other Rays here). The job server lives in the
    dashboard process, so the dashboard is included. With `auth` (see cluster_env), it is asked for the version
    with the token it was given."""
    ports = ports or head_ports()
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    args = ["--head", "--num-cpus", str(num_cpus), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            *extra_args]
    headers = bearer(auth)
    with ray_node(args, temp_dir, ports, lambda: _answers(f"{address}/api/version", headers), env_extra, python,
                  auth):
        yield address, ports["port"]


def head_ports() -> dict[str, int]:
    return free_ports(PORT_FLAGS)


def free_ports(flags: tuple[str, ...]) -> dict[str, int]:
    """A distinct free port per flag: each socket stays bound until all are chosen, so no two flags (Ray refuses
    a port given to two components) can be handed the same one."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in flags]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return {flag: s.getsockname()[1] for flag, s in zip(flags, sockets)}


def bearer(auth: dict[str, str] | None) -> dict[str, str]:
    """The HTTP header that carries the token of `auth` (see cluster_env), as `ray job submit` sends it."""
    if auth is None or "RAY_AUTH_TOKEN_PATH" not in auth:
        return {}
    return {"Authorization": f"Bearer {Path(auth['RAY_AUTH_TOKEN_PATH']).read_text().strip()}"}


def alive_nodes(address: str, headers: dict[str, str] | None = None) -> int:
    try:
        nodes = state(address, "nodes", headers)
    except (OSError, ValueError, KeyError):
        return 0
    return sum(node["state"] == "ALIVE" for node in nodes)


def state(address: str, kind: str, headers: dict[str, str] | None = None) -> list[dict]:
    """Ray's state API list of `kind` (nodes, actors: dead ones included)."""
    request = urllib.request.Request(f"{address}/api/v0/{kind}?detail=1&limit=1000", headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["data"]["result"]["result"]


def short_temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray's socket paths must stay short


def demo_args(out: Path) -> list[str]:
    return [sys.executable, "-m", "raylm", *demo_eval(out)]


def demo_eval(out: Path) -> list[str]:
    return ["eval", "--demo", "--limit", "5", "--output", str(out), "--no-progress"]


# What Ray's job server answers before the head's dashboard agent has registered (it comes up after the dashboard
# answers HTTP, later on a loaded machine): the job was not submitted, and Ray asks to try again.
NO_AGENT_YET = "No available agent to submit job, please try again later"


def submit(address: str, options: list[str], entrypoint: list[str], auth: dict[str, str] | None = None) -> str:
    """`ray job submit OPTIONS -- ENTRYPOINT`, which must succeed; the job's output. Submitted again while the head
    says its agent is not up yet (nothing ran then), until STARTUP_S. `auth` as cluster_env's."""
    deadline = time.monotonic() + STARTUP_S
    while True:
        proc = subprocess.run([RAY, "job", "submit", "--address", address, *options, "--", *entrypoint],
                              env=cluster_env(auth), capture_output=True, text=True, timeout=480)
        if proc.returncode == 0 or NO_AGENT_YET not in proc.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert proc.returncode == 0 and "succeeded" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout


def assert_equals_local_run(results: dict) -> None:
    assert results["n-samples"]["hellaswag"] == {"original": 300, "effective": 5}
    for name in ("hellaswag", "winogrande"):
        assert results["sums"][name] == sums_in_process(name, limit=5)


def raylets_under(temp_dir: Path) -> int:
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # processes exit while we look
            args = cmdline.read_bytes().split(b"\0")
            count += bool(args and args[0].endswith(b"/raylet") and str(temp_dir).encode() in b" ".join(args))
    return count


def test_ray_job_submit_on_two_one_cpu_nodes_with_token_authentication(tmp_path):
    """`ray job submit --working-dir . --runtime-env jobs/runtime-env.yaml -- raylm eval --demo --actors 2` on a
    cluster whose Python lacks raylm and which requires Ray's authentication token, as Ray 2.60 sets one up: the
    head is started with a token at hand (RAY_AUTH_TOKEN_PATH) and RAY_AUTH_MODE unset, and turns authentication
    on by itself; the second node joins with RAY_AUTH_MODE=token; the submit carries the token, and the same
    submit without it is refused. The runtime env installs the checkout on each node that runs the driver or an
    actor (the `raylm` command exists only through it), one actor runs on each node, the driver attaches to the
    cluster it was submitted to (the GCS address it records is the head's; one raylet per node, none started by
    the driver), and the results equal scoring in-process.

    Nodes of one CPU each: an actor must ask for what one node has, not for the cluster's two CPUs (it waited
    for ever). The second node has its own --temp-dir, as a second machine would: nodes that share one session
    directory on one machine each unpack the job's working_dir into it, and the second unpack deletes the running
    driver's working directory (it then died in torch's import, `Intel oneMKL FATAL ERROR: Cannot load
    .../libtorch_cpu.so`, as getcwd() failed)."""
    python = python_without_raylm(tmp_path / "venv")
    env = node_env(python)
    probe = subprocess.run([str(python), "-c", "import ray, torch, transformers, lm_eval, raylm"], env=env,
                           cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'raylm'" in probe.stderr and shutil.which("raylm", path=env["PATH"]) is None
    token = tmp_path / "auth_token"
    token.write_text(generate_new_authentication_token())
    at_hand = {"RAY_AUTH_TOKEN_PATH": str(token)}  # and no RAY_AUTH_MODE: Ray's default decides
    with_token = {**at_hand, "RAY_AUTH_MODE": "token"}
    headers = bearer(with_token)
    # pip builds the checkout with the setuptools here rather than one it downloads into an isolated build
    # environment: the same install, offline and faster. (pip reads a --no-* option's variable inverted: 0 sets it.)
    offline_build = {"PIP_NO_BUILD_ISOLATION": "0"}
    out = tmp_path / "out"
    options = ["--working-dir", str(REPO), "--runtime-env", str(RUNTIME_ENV)]
    entrypoint = ["raylm", *demo_eval(out), "--actors", "2"]
    head_dir, node_dir = short_temp_dir(), short_temp_dir()
    try:
        with ray_head(head_dir, num_cpus=1, env_extra=offline_build, python=python, auth=at_hand) as (address,
                                                                                                     gcs_port):
            with ray_node(["--address", f"127.0.0.1:{gcs_port}", "--num-cpus", "1"], node_dir,
                          free_ports(NODE_PORT_FLAGS), lambda: alive_nodes(address, headers) == 2, offline_build,
                          python, with_token):
                submit(address, options, entrypoint, with_token)
                refused = subprocess.run([RAY, "job", "submit", "--address", address, "--", "true"],
                                         env=cluster_env(), capture_output=True, text=True, timeout=120)
                nodes = {n["node_id"] for n in state(address, "nodes", headers)}
                actor_nodes = sorted(a["node_id"] for a in state(address, "actors", headers)
                                     if a["class_name"] == "ScoringActor")
                installed = [installed_raylm(d) for d in (head_dir, node_dir)]
                assert raylets_under(head_dir) == raylets_under(node_dir) == 1
    finally:
        shutil.rmtree(head_dir, ignore_errors=True)
        shutil.rmtree(node_dir, ignore_errors=True)
    assert refused.returncode != 0 and "Authentication required" in refused.stdout + refused.stderr
    assert sorted(nodes) == actor_nodes
    assert installed == [["raylm-0.1.0.dist-info"]] * 2
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["ray_gcs_address"].endswith(f":{gcs_port}")
    assert_equals_local_run(results)


def installed_raylm(temp_dir: Path) -> list[str]:
    """The raylm distributions Ray's pip runtime envs on the node with this --temp-dir installed."""
    pattern = "session_latest/runtime_resources/pip/*/virtualenv/lib/python*/site-packages/raylm-*.dist-info"
    return sorted(p.name for p in temp_dir.glob(pattern))


def sums_in_process(task: str, limit: int) -> dict[str, float]:
    """The same task scored here, without Ray: what the job's actors must have produced."""
    spec = ModelSpec(str(DEMO_MODEL))
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, (task,), DEMO_DATA, limit=limit), encoder)
    kind, table = tables[task]
    return score_shard(Scorer(model, encoder.max_length), kind, table).sums
