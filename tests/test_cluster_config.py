"""cluster.yaml is a launcher config `ray up` accepts: it validates against the autoscaler's own JSON schema,
shipped inside the installed ray package, and describes GPU workers that install raylm, on an AMI whose NVIDIA driver
runs the image's CUDA; the jobs the shipped files show write where that cluster can. Every manifest (cluster.yaml,
rayjob.yaml, the Dockerfile) names one Ray, the one installed here; jobs/runtime-env.yaml is a runtime env Ray
accepts, which installs the checkout, leaves local clutter behind and gives a torch install time to finish."""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.metadata
import json
import re
import shlex
import sys
import tomllib
import zipfile
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from ray._private.ray_constants import DEFAULT_RUNTIME_ENV_TIMEOUT_SECONDS
from ray._private.runtime_env.packaging import create_package
from ray.autoscaler._private.aws.config import DEFAULT_AMI
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for
from ray.dashboard.modules.dashboard_sdk import parse_runtime_env_args
from ray.runtime_env import RuntimeEnv

from test_memory_table import LLAMA_VOCAB, SHAPES, llama_parameters
from transformers import LlamaConfig

from raylm.cli import build_parser
from raylm.cluster.capacity import HEAD_RESOURCE, NODE_TYPES_ENV, capacity_of, node_types_from_config
from raylm.cluster.placement import Ask, plan
from raylm.models.devices import WEIGHTS_FRACTION
from raylm.scoring.memory import GIB

REPO = Path(__file__).resolve().parents[1]
RAY_IMAGE = f"rayproject/ray:{ray.__version__}-py311-gpu"
# What no node or image should receive from a checkout: a local virtualenv (several GB), git's history, outputs.
CLUTTER = (".venv/", ".git/", "raylm-out/", "raylm-sweeps/")


# The raylm extras every install path (jobs/runtime-env.yaml, the Dockerfile, cluster.yaml's setup) names: every
# lm-eval task, --peft, --wandb_args.
FLAG_EXTRAS = "tasks,peft,wandb"


def load() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def dockerfile_pip_install() -> list[str]:
    """The words of the Dockerfile's one RUN line that pip installs."""
    runs = re.findall(r"^RUN (.+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    [install] = [shlex.split(run) for run in runs if run.startswith("pip install ")]
    return install


def test_cluster_yaml_matches_ray_autoscaler_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(load(), schema)


def test_schema_check_would_catch_a_bad_config():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = load()
    config["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    validator = jsonschema.Draft7Validator(schema)
    assert any("'one' is not of type 'integer'" in e.message for e in validator.iter_errors(config))


def test_gpu_workers_autoscale_and_install_the_synced_checkout_with_every_flags_extras():
    """Setup installs the checkout file_mounts copies to each node, with the extras the other install paths name
    (what each needs: test_every_install_path_brings_what_each_flag_and_task_family_imports), and names Ray at the
    image's version in the same pip command, so the resolver keeps it."""
    config = load()
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu and all(0 <= t["min_workers"] <= t["max_workers"] <= config["max_workers"] for t in gpu)
    [setup] = config["setup_commands"]
    words = shlex.split(setup)
    assert words[:4] == ["python", "-m", "pip", "install"]
    path, extras = re.fullmatch(r"\$HOME/(.+)\[(.+)\]", words[words.index("-e") + 1]).groups()
    assert config["file_mounts"][f"~/{path}"] == "." and extras == FLAG_EXTRAS
    assert f"ray[default]=={ray.__version__}" in words


def test_setup_pins_what_moves_numbers_as_the_image_does():
    """Every node installs torch, transformers, lm-eval and Ray at the Dockerfile's pins (which
    tests/test_rayjob.py holds to the versions CI tests), not whatever the index serves on the day."""
    [setup] = load()["setup_commands"]
    pins = [{w for w in words if "==" in w} for words in (shlex.split(setup), dockerfile_pip_install())]
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


def test_runtime_env_file_is_one_ray_accepts_and_installs_the_working_dir_with_every_flags_extras():
    env = runtime_env_file()
    RuntimeEnv(**env)  # Ray's own validation of each field
    assert env["pip"] == [f"${{RAY_RUNTIME_ENV_CREATE_WORKING_DIR}}[{FLAG_EXTRAS}]"]


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
    assert [t.name for t in types if t.resources.get("GPU", 0) >= 1] == ["gpu_worker", "gpu_worker_4x"]
    assert max_added == config["max_workers"]


def test_a_job_on_the_fresh_cluster_asks_for_one_gpu_actor_per_gpu_it_can_grow_to():
    """What docs/cluster.md says the first job on cluster.yaml logs, with only its 0-CPU head up."""
    head = {**load()["available_node_types"]["head"]["resources"], HEAD_RESOURCE: 1.0}
    placement = plan(Ask(), capacity_of([head], None, str(REPO / "cluster.yaml"), started_here=False))
    line = ("16 actors x 1 GPU (0.5 CPU each): one per GPU the cluster can grow to (16); --device auto: no GPU up "
            "yet; the autoscaler may add gpu_worker, gpu_worker_4x nodes (from RAYLM_NODE_TYPES)")
    assert placement.reason == line and f"placement: {line}" in (REPO / "docs" / "cluster.md").read_text()


# What each flag and task family imports beyond raylm's core dependencies, and the distribution that brings it; the
# sources are those whose imports say so (lm-eval's installed ones, raylm's own).
NEEDS = {
    "--peft": ({"peft": "peft"}, ["raylm/models/loading.py", "raylm/models/spec.py"]),
    "--wandb_args": ({"wandb": "wandb"}, ["raylm/results/wandb_log.py", "lm_eval/loggers/wandb_logger.py"]),
    "IFEval": ({"langdetect": "langdetect", "immutabledict": "immutabledict", "nltk": "nltk"},
               ["lm_eval/tasks/ifeval/instructions.py", "lm_eval/tasks/ifeval/instructions_util.py"]),
    "MATH": ({"sympy": "sympy", "math_verify": "math-verify", "antlr4": "antlr4-python3-runtime"},
             ["lm_eval/tasks/leaderboard/math/utils.py", "lm_eval/tasks/minerva_math/utils.py"]),
}
# What raylm's core dependencies bring that those sources import too (pandas comes with datasets).
CORE_IMPORTS = {"numpy", "pandas", "packaging", "datasets", "torch", "transformers", "bitsandbytes"}
# Where lm-eval is installed: its sources are read, never imported.
LM_EVAL = Path(importlib.metadata.distribution("lm-eval").locate_file(""))


def imported_modules(path: Path) -> set[str]:
    """Every top-level module a source imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("family", NEEDS)
def test_what_each_flag_and_task_family_imports_beyond_raylms_core(family):
    """Read from the code that runs: raylm's for --peft, lm-eval's installed task and logger code for the rest.
    A release of lm-eval that imports something new fails this until NEEDS (and the extras) follow."""
    modules, sources = NEEDS[family]
    imported = set().union(*(imported_modules((REPO if s.startswith("raylm/") else LM_EVAL) / s) for s in sources))
    third_party = imported - set(sys.stdlib_module_names) - {"lm_eval", "raylm", "__future__"} - CORE_IMPORTS
    assert third_party == set(modules)


def lm_eval_extra(extras: set[str]) -> set[str]:
    """The distributions lm-eval's extras require, as its installed metadata lists them (lm_eval[x] followed)."""
    names = set()
    for line in importlib.metadata.metadata("lm-eval").get_all("Requires-Dist"):
        req = Requirement(line)
        for extra in extras:
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                names |= lm_eval_extra(req.extras) if canonicalize_name(req.name) == "lm-eval" \
                    else {canonicalize_name(req.name)}
    return names


def installed_by(extras: str) -> set[str]:
    """What `pip install .[extras]` brings beyond raylm's core, by distribution: pyproject.toml's extras (raylm[x]
    followed), and for lm-eval, the extras it names, from lm-eval's installed metadata."""
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names, todo, seen = set(), extras.split(","), set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for req in map(Requirement, optional[extra]):
            if canonicalize_name(req.name) == "raylm":
                todo += [e for e in req.extras if e not in seen]
            else:
                names.add(canonicalize_name(req.name))
                if canonicalize_name(req.name) == "lm-eval":
                    names |= lm_eval_extra(req.extras)
    return names


def install_paths() -> dict[str, str]:
    """The raylm extras each cluster install path names: the runtime env's pip line, the Dockerfile's RUN line and
    cluster.yaml's setup."""
    [pip] = runtime_env_file()["pip"]
    [setup] = load()["setup_commands"]
    setup_words = shlex.split(setup)
    return {"jobs/runtime-env.yaml": re.fullmatch(r"\$\{RAY_RUNTIME_ENV_CREATE_WORKING_DIR\}\[(.+)\]", pip).group(1),
            "Dockerfile": re.fullmatch(r"\.\[(.+)\]", dockerfile_pip_install()[-1]).group(1),
            "cluster.yaml": re.fullmatch(r".+\[(.+)\]", setup_words[setup_words.index("-e") + 1]).group(1)}


@pytest.mark.parametrize("path", ["jobs/runtime-env.yaml", "Dockerfile", "cluster.yaml"])
def test_every_install_path_brings_what_each_flag_and_task_family_imports(path):
    """--peft, --wandb_args, IFEval and MATH import something raylm's core lacks: each cluster's install brings it,
    through pyproject.toml's extras and lm-eval's own (a job fails at import otherwise, on a node nobody can fix)."""
    installed = installed_by(install_paths()[path])
    missing = {family: sorted(set(map(canonicalize_name, modules.values())) - installed)
               for family, (modules, _) in NEEDS.items()}
    assert not any(missing.values()), missing


def test_the_image_brings_ifevals_punkt_tab_where_nltk_data_points():
    """IFEval's code looks for nltk's tokenizers/punkt_tab when imported and downloads it where it is missing
    (read from lm-eval's installed source): the image downloads it at build, into the directory NLTK_DATA names,
    and fails the build where it could not; docs/cluster.md tells an air-gapped cluster the same."""
    looked_for = re.findall(r'nltk\.data\.find\("([^"]+)"\)',
                            (LM_EVAL / "lm_eval/tasks/ifeval/instructions_util.py").read_text())
    assert looked_for == ["tokenizers/punkt_tab"]
    dockerfile = (REPO / "Dockerfile").read_text()
    [nltk_data] = re.findall(r"^ENV NLTK_DATA=(\S+)$", dockerfile, re.MULTILINE)
    [code] = [shlex.split(run)[2] for run in re.findall(r"^RUN (.+)$", dockerfile, re.MULTILINE)
              if run.startswith("python -c ")]
    calls = {node.func.attr: node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)}
    download = calls["download"]
    assert [a.value for a in download.args] == ["punkt_tab"]
    assert {k.arg: k.value.value for k in download.keywords} == {"download_dir": nltk_data, "raise_on_error": True}
    assert [a.value for a in calls["find"].args] == looked_for
    assert dockerfile.index("ENV NLTK_DATA=") < dockerfile.index("RUN python -c ")
    assert "NLTK_DATA" in (REPO / "docs" / "cluster.md").read_text()


def head_policy() -> dict:
    """The IAM policy docs/cluster.md gives the head's role: the page's one JSON block."""
    [block] = re.findall(r"```json\n(.+?)```", (REPO / "docs" / "cluster.md").read_text(), re.DOTALL)
    return json.loads(block)


def allowed(policy: dict, action: str, resource: str) -> bool:
    return any(s["Effect"] == "Allow" and action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
               and fnmatch.fnmatchcase(resource, s["Resource"]) for s in policy["Statement"])


def test_the_head_may_launch_workers_with_their_ami_and_profile():
    """The head names its instance profile (Ray's default head role may neither resolve the workers' SSM ImageId
    nor pass them a profile, so every worker launch fails); the policy docs/cluster.md gives that role allows the
    launch, the ImageId's SSM parameter and the workers' role, in the account cluster.yaml's ARNs name."""
    config = load()
    types = config["available_node_types"]
    profiles = {name: t["node_config"]["IamInstanceProfile"]["Arn"] for name, t in types.items()}
    arn = re.compile(r"arn:aws:iam::(\d{12}):instance-profile/([\w+=,.@-]+)")
    [account] = {arn.fullmatch(profile).group(1) for profile in profiles.values()}
    head = arn.fullmatch(profiles.pop(config["head_node_type"])).group(2)
    [worker] = {arn.fullmatch(profile).group(2) for profile in profiles.values()}
    assert head != worker
    policy = head_policy()
    region = config["provider"]["region"]
    for image in {t["node_config"]["ImageId"] for t in types.values()}:
        parameter = image.removeprefix("resolve:ssm:")
        assert allowed(policy, "ssm:GetParameters", f"arn:aws:ssm:{region}::parameter{parameter}")
    assert allowed(policy, "iam:PassRole", f"arn:aws:iam::{account}:role/{worker}")
    assert not allowed(policy, "iam:PassRole", f"arn:aws:iam::{account}:role/{head}")
    assert all(allowed(policy, f"ec2:{a}", "*") for a in ("RunInstances", "CreateTags", "DescribeInstances",
                                                          "TerminateInstances"))
    docs = (REPO / "docs" / "cluster.md").read_text()
    assert f"for name in {head} {worker}; do" in docs
    assert f"--role-name {head} --policy-name {head} --policy-document file://{head}-policy.json" in docs


# GPU memory per GPU (GiB) of the instance types cluster.yaml names, from AWS's instance type pages.
GPU_GIB = {"g5.xlarge": 24, "g6e.12xlarge": 48}


def test_numerics_70b_example_runs_on_the_four_gpu_workers():
    """docs/numerics.md's Llama-3.1-70B command: raylm plans its actors on cluster.yaml's node types (each actor's
    GPUs on one node), Ray's autoscaler chooses the four-GPU type for them and the single-GPU type for one-GPU
    actors, and the bfloat16 weights fit the planner's share of that type's GPUs."""
    [line] = [line for line in (REPO / "docs" / "numerics.md").read_text().splitlines()
              if line.startswith("raylm eval --model meta-llama/Llama-3.1-70B")]
    args = build_parser().parse_args(shlex.split(line)[1:])
    config = load()
    head = {**config["available_node_types"]["head"]["resources"], HEAD_RESOURCE: 1.0}
    capacity = capacity_of([head], None, str(REPO / "cluster.yaml"), started_here=False)
    placement = plan(Ask(num_gpus=args.num_gpus, actors=args.actors), capacity)
    assert placement.reason == f"{args.actors} actors x {args.num_gpus:g} GPU (0.5 CPU each): --actors " \
                               f"{args.actors}; --num-gpus {args.num_gpus:g}"
    types = config["available_node_types"]
    scorer = functools.partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({}))

    def chosen(gpus: float, actors: int) -> dict[str, int]:
        return dict(get_nodes_for(types, {}, config["head_node_type"], config["max_workers"],
                                  [{"GPU": gpus, "CPU": 0.5}] * actors, utilization_scorer=scorer)[0])

    [(four, nodes)] = chosen(args.num_gpus, args.actors).items()
    assert types[four]["resources"]["GPU"] == args.num_gpus and nodes == args.actors <= types[four]["max_workers"]
    assert chosen(1, 8) == {"gpu_worker": 8}
    weights = 2 * llama_parameters(LlamaConfig(vocab_size=LLAMA_VOCAB, **SHAPES["Llama-3.1-70B"]))
    gpu = GPU_GIB[types[four]["node_config"]["InstanceType"]] * GIB
    assert weights <= WEIGHTS_FRACTION * args.num_gpus * gpu
    assert weights > WEIGHTS_FRACTION * args.num_gpus * GPU_GIB["g5.xlarge"] * GIB  # four 24 GiB GPUs would not do


def test_docs_tasks_md_lists_what_ifeval_and_math_need_as_lm_evals_extras_say():
    """The task page's table names, for IFEval and MATH, every distribution lm-eval's extra of that name lists."""
    text = (REPO / "docs" / "tasks.md").read_text()
    rows = {family: next(line for line in text.splitlines() if line.startswith(f"| {family}: "))
            for family in ("IFEval", "MATH")}
    for family, extra in (("IFEval", "ifeval"), ("MATH", "math")):
        assert f"lm-eval's `{extra}` extra" in rows[family]
        assert all(name in canonicalize_name(rows[family]) for name in lm_eval_extra({extra}))


def shell_lines(text: str, fence: str) -> list[str]:
    """The lines of a page's code blocks of one kind (```sh, ```bash)."""
    return [line for block in re.findall(rf"```{fence}\n(.+?)```", text, re.DOTALL) for line in block.splitlines()]


def test_every_recipe_that_starts_a_head_says_how_ray_authenticates():
    """A head started where ~/.ray/auth_token exists (any earlier local Ray run leaves one; on Slurm's shared home,
    on every node) requires the token, and a node or driver without RAY_AUTH_MODE=token is refused: the Slurm
    recipe and the README's local head set it before their first `ray start`, for every node and the driver."""
    [sbatch] = [block for block in re.findall(r"```sh\n(.+?)```", (REPO / "docs" / "cluster.md").read_text(),
                                              re.DOTALL) if "#SBATCH" in block]
    lines = sbatch.splitlines()
    first_start = next(i for i, line in enumerate(lines) if "ray start" in line)
    assert "export RAY_AUTH_MODE=token" in lines[:first_start]
    readme = shell_lines((REPO / "README.md").read_text().replace("\\\n", " "), "bash")
    [head] = [shlex.split(line, comments=True) for line in readme if "ray start --head" in line]
    assert head[head.index("start") - 2:head.index("start")] == ["RAY_AUTH_MODE=token", "ray"]
    submits = [shlex.split(line, comments=True) for line in readme if "ray job submit" in line]
    assert submits and all(words[:4] == ["RAY_AUTH_MODE=token", "ray", "job", "submit"] for words in submits)
