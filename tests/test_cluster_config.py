"""cluster.yaml is a launcher config `ray up` accepts: it validates against the autoscaler's own JSON schema,
shipped inside the installed ray package, and describes GPU workers that install raylm, on an AMI whose NVIDIA driver
runs the image's CUDA; the jobs the shipped files show write where that cluster can. Every manifest (cluster.yaml,
rayjob.yaml, the Dockerfile) names one Ray, the one installed here; jobs/runtime-env.yaml is a runtime env Ray
accepts, which installs the checkout, leaves local clutter behind and gives a torch install time to finish."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
import zipfile
from pathlib import Path

import jsonschema
import ray
import yaml
from packaging.requirements import Requirement
from ray._private.ray_constants import DEFAULT_RUNTIME_ENV_TIMEOUT_SECONDS
from ray._private.runtime_env.packaging import create_package
from ray.autoscaler._private.aws.config import DEFAULT_AMI
from ray.dashboard.modules.dashboard_sdk import parse_runtime_env_args
from ray.runtime_env import RuntimeEnv

from raylm.cluster.capacity import HEAD_RESOURCE, NODE_TYPES_ENV, capacity_of, node_types_from_config
from raylm.cluster.placement import Ask, plan

REPO = Path(__file__).resolve().parents[1]
RAY_IMAGE = f"rayproject/ray:{ray.__version__}-py311-gpu"
# What no node or image should receive from a checkout: a local virtualenv (several GB), git's history, outputs.
CLUTTER = (".venv/", ".git/", "raylm-out/", "raylm-sweeps/")


def load() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_matches_ray_autoscaler_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(load(), schema)


def test_schema_check_would_catch_a_bad_config():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = load()
    config["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    validator = jsonschema.Draft7Validator(schema)
    assert any("'one' is not of type 'integer'" in e.message for e in validator.iter_errors(config))


def test_gpu_workers_autoscale_and_install_the_synced_checkout_with_tasks():
    """Setup installs the checkout file_mounts copies to each node, with [tasks] (every lm-eval task), and names
    Ray at the image's version in the same pip command, so the resolver keeps it."""
    config = load()
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu and all(0 <= t["min_workers"] <= t["max_workers"] <= config["max_workers"] for t in gpu)
    [setup] = config["setup_commands"]
    words = shlex.split(setup)
    assert words[:4] == ["python", "-m", "pip", "install"]
    path, extras = re.fullmatch(r"\$HOME/(.+)\[(.+)\]", words[words.index("-e") + 1]).groups()
    assert config["file_mounts"][f"~/{path}"] == "." and extras == "tasks"
    assert f"ray[default]=={ray.__version__}" in words


def test_setup_pins_what_moves_numbers_as_the_image_does():
    """Every node installs torch, transformers, lm-eval and Ray at the Dockerfile's pins (which
    tests/test_rayjob.py holds to the versions CI tests), not whatever the index serves on the day."""
    [setup] = load()["setup_commands"]
    [install] = re.findall(r"^RUN (.+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    pins = [{w for w in shlex.split(command) if "==" in w} for command in (setup, install)]
    assert pins[0] == pins[1] and len(pins[0]) == 4


def test_one_ray_everywhere_the_one_pyproject_accepts_and_ci_installs():
    """cluster.yaml's image and setup, rayjob.yaml's rayVersion and the Dockerfile's base name the Ray installed
    here: what CI's install of pyproject.toml's range resolved to. A Ray release inside that range fails this
    until the manifests follow it, so that head, workers and images never run two Rays."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    [ray_range] = [r for r in map(Requirement, pyproject["project"]["dependencies"]) if r.name == "ray"]
    assert ray_range.specifier.contains(ray.__version__) and "default" in ray_range.extras
    config = load()
    assert config["docker"]["image"] == RAY_IMAGE
    assert not {"head_image", "worker_image"} & set(config["docker"])
    rayjob = {doc["kind"]: doc for doc in yaml.safe_load_all((REPO / "rayjob.yaml").read_text())}["RayJob"]
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == ray.__version__
    assert re.findall(r"^FROM (\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE) == [RAY_IMAGE]


def test_rsync_leaves_a_venv_git_and_outputs_behind():
    """`ray up` copies file_mounts with rsync, passing rsync_exclude and rsync_filter (per directory, as git reads
    .gitignore); .gitignore itself lists the virtualenv and the output folders."""
    config = load()
    assert set(CLUTTER) <= set(config["rsync_exclude"]) and config["rsync_filter"] == [".gitignore"]
    ignored = (REPO / ".gitignore").read_text().split()
    assert all(any(line.strip("/") == path.strip("/") for line in ignored) for path in CLUTTER if path != ".git/")


# The ImageId every node boots: AWS's Deep Learning Base AMI with a current NVIDIA driver, by its public SSM parameter.
GPU_AMI = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
# Where a job on cluster.yaml may write: the home of the user Ray's image runs as (the driver's), or a storage URI.
RAY_HOME = "/home/ray"


def test_every_node_boots_a_current_nvidia_driver_not_rays_default_ami():
    """Ray's default AMI for the region (its CUDA 11.2 driver cannot run the image's CUDA or torch's) is used only
    for a node type without an ImageId; every node type names AWS's Deep Learning Base GPU AMI."""
    config = load()
    images = {name: t["node_config"].get("ImageId") for name, t in config["available_node_types"].items()}
    assert set(images.values()) == {GPU_AMI}
    assert GPU_AMI.lower() not in ("", "latest_dlami") and GPU_AMI not in DEFAULT_AMI.values()
    assert "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" in (REPO / "cluster.yaml").read_text()


def submitted_outputs(path: Path) -> list[str]:
    """The --output of every `ray job submit` a file's comments show (`\\` continuations joined)."""
    text = "\n".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.lstrip().startswith("#"))
    commands = [shlex.split(line, comments=True) for line in text.replace("\\\n", " ").splitlines()
                if line.startswith("ray job submit ")]
    return [words[words.index("--output") + 1] for words in commands if "--output" in words]


def test_every_shipped_job_writes_where_the_shipped_cluster_can():
    """The jobs the shipped files show write under the home of Ray's image user on cluster.yaml's head, or to a
    storage URI; never to a path no shipped node mounts or owns (/mnt/results, /shared)."""
    outputs = [out for path in [REPO / "cluster.yaml", *sorted((REPO / "jobs").glob("*.yaml"))]
               for out in submitted_outputs(path)]
    assert len(outputs) >= 3
    assert all(re.match(r"[a-z0-9]+://", out) or Path(out).is_relative_to(RAY_HOME) for out in outputs), outputs
    assert load()["docker"]["image"].startswith("rayproject/ray:")


def runtime_env_file() -> dict:
    """jobs/runtime-env.yaml as `ray job submit --working-dir . --runtime-env jobs/runtime-env.yaml` reads it."""
    return parse_runtime_env_args(runtime_env=str(REPO / "jobs" / "runtime-env.yaml"), working_dir=".")


def test_runtime_env_file_is_one_ray_accepts_and_installs_the_working_dir_with_tasks():
    env = runtime_env_file()
    RuntimeEnv(**env)  # Ray's own validation of each field
    assert env["pip"] == ["${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}[tasks]"]


def test_runtime_env_file_gives_a_torch_install_more_than_rays_default_setup_time():
    """On Ray's stock images the pip line installs torch with its CUDA libraries (several GB) on every node: more
    than Ray's default 600 s may allow, so the file raises the limit, and says how far."""
    timeout = runtime_env_file()["config"]["setup_timeout_seconds"]
    assert timeout >= 3 * DEFAULT_RUNTIME_ENV_TIMEOUT_SECONDS
    assert f"setup_timeout_seconds: {timeout}" in (REPO / "docs" / "cluster.md").read_text()


def test_runtime_env_file_uploads_the_checkout_without_clutter(tmp_path):
    """Ray's own packager, given the file's excludes (and not .gitignore, which a cluster may be told to skip),
    packs sources and leaves every kind of clutter out."""
    checkout = tmp_path / "checkout"
    kept = ["pyproject.toml", "raylm/cli.py", "jobs/demo.yaml"]
    for name in [*kept, *(f"{path}x" for path in CLUTTER), "raylm.egg-info/PKG-INFO", "build/lib/raylm/cli.py"]:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("")
    package = tmp_path / "package.zip"
    create_package(str(checkout), package, include_gitignore=False, excludes=runtime_env_file()["excludes"])
    assert sorted(zipfile.ZipFile(package).namelist()) == sorted(kept)


def test_head_tells_placement_which_nodes_the_autoscaler_may_add():
    """The head's `ray start` sets RAYLM_NODE_TYPES to the very config the autoscaler runs (its jobs' drivers
    inherit it), and that config, read as raylm reads it, names the GPU workers."""
    config = load()
    start = next(c for c in config["head_start_ray_commands"] if "ray start --head" in c)
    words = shlex.split(start)
    hint = next(w.split("=", 1)[1] for w in words if w.startswith(f"{NODE_TYPES_ENV}="))
    autoscaling = next(w.split("=", 1)[1] for w in words if w.startswith("--autoscaling-config="))
    assert hint == autoscaling and words.index(f"{NODE_TYPES_ENV}={hint}") < words.index("ray")
    types, max_added = node_types_from_config(config, "cluster.yaml", strict=False)
    assert [t.name for t in types if t.resources.get("GPU", 0) >= 1] == ["gpu_worker"]
    assert max_added == config["max_workers"]


def test_a_job_on_the_fresh_cluster_asks_for_one_gpu_actor_per_gpu_it_can_grow_to():
    """What docs/cluster.md says the first job on cluster.yaml logs, with only its 0-CPU head up."""
    head = {**load()["available_node_types"]["head"]["resources"], HEAD_RESOURCE: 1.0}
    placement = plan(Ask(), capacity_of([head], None, str(REPO / "cluster.yaml"), started_here=False))
    line = ("8 actors x 1 GPU (0.5 CPU each): one per GPU the cluster can grow to (8); --device auto: no GPU up yet; "
            "the autoscaler may add gpu_worker nodes (from RAYLM_NODE_TYPES)")
    assert placement.reason == line and f"placement: {line}" in (REPO / "docs" / "cluster.md").read_text()
