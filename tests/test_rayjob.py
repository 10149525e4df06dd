"""rayjob.yaml is a RayJob the Kubernetes API server accepts once KubeRay is installed: it validates against
KubeRay's own CRD schema (vendored in tests/kuberay/, with its source and licence), read as the API server's strict
field validation reads it (an unknown field is an error, not silently dropped); its pods run the image the Dockerfile
builds (Ray's pinned image plus the README's GPU install line) as the Ray image's user, with the volumes writable,
HF_TOKEN from a Secret, object-store credentials for the driver, and claims every default storage class can bind;
its runtime environment is one Ray accepts; its entrypoint is a raylm command; and the placement hint it passes says
what its worker group is. The image pins what moves numbers to the versions CI tests. (No docker build runs here.)

The schema's CEL rules (x-kubernetes-validations) are not evaluated here; they concern fields the manifest does not
use (deletionStrategy, managedBy, gcsFaultToleranceOptions).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from packaging.requirements import Requirement
from ray.runtime_env import RuntimeEnv

from raylm.cli import build_parser
from raylm.cluster.capacity import NODE_TYPES_ENV, NodeType, parse_node_types

REPO = Path(__file__).resolve().parents[1]
SCHEMA = Path(__file__).parent / "kuberay" / "ray.io_rayjobs.v1.schema.json"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in manifests() if doc["kind"] != "PersistentVolumeClaim"}


def claims() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in manifests() if doc["kind"] == "PersistentVolumeClaim"}


def manifests() -> list[dict]:
    return list(yaml.safe_load_all((REPO / "rayjob.yaml").read_text()))


def pod_specs() -> list[dict]:
    cluster = documents()["RayJob"]["spec"]["rayClusterSpec"]
    return [g["template"]["spec"] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]


def strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others, as the API server's strict field
    validation treats a structural schema (none of KubeRay's keeps unknown fields)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(json.loads(SCHEMA.read_text())))


def test_rayjob_matches_kuberays_crd_schema(validator):
    job = documents()["RayJob"]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]
    assert not errors, errors
    assert jsonschema.Draft7Validator({"pattern": DNS_SUBDOMAIN, "maxLength": 253}).is_valid(job["metadata"]["name"])


@pytest.mark.parametrize("path,value,message", [
    (("spec", "shutdownAfterJobFinishes"), "yes", "'yes' is not of type 'boolean'"),
    (("spec", "shutdownAfterJobFinish"), True, "Additional properties are not allowed ('shutdownAfterJobFinish'"),
    (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-cpus"), 0, "0 is not of type 'string'"),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas"), "8", "'8' is not of type 'integer'"),
])
def test_the_schema_check_would_catch_a_bad_manifest(validator, path, value, message):
    job = copy.deepcopy(documents()["RayJob"])
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(message in e.message for e in validator.iter_errors(job)), [e.message for e in
                                                                           validator.iter_errors(job)]


def test_runtime_env_is_one_ray_accepts_and_fetches_nothing():
    """raylm is in the image: the job installs nothing from a package index (where raylm is not published)."""
    env = yaml.safe_load(documents()["RayJob"]["spec"]["runtimeEnvYAML"])
    RuntimeEnv(**env)  # Ray's own validation of each field
    assert not {"pip", "uv", "conda", "py_modules", "working_dir"} & set(env)


def test_every_pod_runs_the_image_the_dockerfile_builds():
    """One image on head and workers, named for raylm's version and the Ray it is built on; the Dockerfile builds
    that name from Ray's pinned image, copies the checkout (without clutter) and installs it by the README's GPU
    install line, [tasks] included."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    image = f"raylm:{version}-ray{ray.__version__}-py311-gpu"
    assert {c["image"] for spec in pod_specs() for c in spec["containers"]} == {image}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"docker build -t {image} ." in dockerfile
    assert re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE) == [f"rayproject/ray:{ray.__version__}-py311-gpu"]
    assert re.search(r"^WORKDIR (\S+)\nCOPY --chown=ray:users \. \.$", dockerfile, re.MULTILINE)
    readme = re.search(r"on a GPU machine keep your torch and `([^`]+)`", (REPO / "README.md").read_text())
    assert readme.group(1) == 'pip install -e ".[tasks]"'
    install = dockerfile_install()
    extras = re.fullmatch(r"\.\[(.+)\]", install[-1]).group(1).split(",")
    assert install[:2] == ["pip", "install"] and install[-2] == "-e" and "tasks" in extras
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv/", ".git/", "raylm-out/", "raylm-sweeps/"} <= set(ignored)


def dockerfile_install() -> list[str]:
    runs = re.findall(r"^RUN (.+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    [install] = [shlex.split(run) for run in runs if run.startswith("pip install ")]
    return install


def test_the_image_pins_what_moves_numbers_to_the_versions_ci_tests():
    """An image built on a later day scores as the tested checkout did: torch at the README's and .ci/run's pin,
    lm-eval at pyproject.toml's, transformers and Ray at the versions installed here (what CI's install of
    pyproject.toml resolved to). A release CI moves to fails this until the Dockerfile follows it."""
    pins = {Requirement(w).name: Requirement(w) for w in dockerfile_install() if "==" in w}
    assert set(pins) == {"torch", "transformers", "lm-eval", "ray"}
    version = {name: str(req.specifier).removeprefix("==") for name, req in pins.items()}
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    [readme_torch] = set(re.findall(r"pip install torch==(\S+)", readme))
    [ci_torch] = set(re.findall(r"pip install --quiet torch==(\S+)", ci))
    assert version["torch"] == readme_torch == ci_torch == importlib.metadata.version("torch").split("+")[0]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [lm_eval] = [Requirement(r) for r in extras["tasks"] if Requirement(r).name == "lm-eval"]
    assert pins["lm-eval"].specifier == lm_eval.specifier
    assert version["transformers"] == importlib.metadata.version("transformers")
    assert version["ray"] == ray.__version__ and pins["ray"].extras == {"default"}


def test_pods_run_as_the_ray_images_user_with_their_volumes_writable():
    """The Ray image runs as uid 1000 in group 100 (users); fsGroup 100 makes each mounted volume writable by it
    (a fresh ReadWriteOnce volume is root's otherwise, and the first write of results.json fails)."""
    for spec in pod_specs():
        assert spec["volumes"] and all({"persistentVolumeClaim", "emptyDir"} & set(v) for v in spec["volumes"])
        assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100}


def test_every_claim_binds_on_default_storage_classes_and_only_the_head_mounts_it():
    """ReadWriteOnce, which every cloud's default class offers (a ReadWriteMany claim stays Pending on EKS's and
    GKE's), and so mounted by one pod: the head, where the driver writes."""
    head, *workers = pod_specs()
    assert claims() and all(c["spec"]["accessModes"] == ["ReadWriteOnce"] for c in claims().values())
    assert {v["persistentVolumeClaim"]["claimName"] for v in head["volumes"] if "persistentVolumeClaim" in v} \
        == set(claims())
    assert not [v for spec in workers for v in spec["volumes"] if "persistentVolumeClaim" in v]


def test_hf_token_comes_from_a_secret_and_hf_home_is_a_volume_of_each_pod():
    """Actors inherit their node's environment: HF_TOKEN (gated models) from a Kubernetes Secret, never written in
    the manifest, and HF_HOME on a volume of the pod's own (emptyDir), which needs no shared storage class."""
    for spec in pod_specs():
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            env = {e["name"]: e for e in container["env"]}
            secret = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert secret["name"] and secret["key"] == "HF_TOKEN" and "value" not in env["HF_TOKEN"]
            [cache] = [m for m in container["volumeMounts"] if m["mountPath"] == env["HF_HOME"]["value"]]
            assert "emptyDir" in volumes[cache["name"]]


def test_the_driver_has_object_store_credentials_from_a_cloud_identity_or_a_secret():
    """The head, where the driver writes --output, runs as a service account annotated for EKS's IRSA and GKE's
    Workload Identity, and takes every key of an optional Secret as environment variables (AWS_ACCESS_KEY_ID, ...)
    where no identity is used."""
    head = pod_specs()[0]
    account = documents()["ServiceAccount"]
    assert head["serviceAccountName"] == account["metadata"]["name"]
    assert {"eks.amazonaws.com/role-arn", "iam.gke.io/gcp-service-account"} <= set(account["metadata"]["annotations"])
    [container] = head["containers"]
    [source] = container["envFrom"]
    assert source["secretRef"]["name"] and source["secretRef"]["optional"] is True


def test_entrypoint_is_a_raylm_command_writing_to_the_results_volume():
    docs = documents()
    spec = docs["RayJob"]["spec"]
    program, *args = shlex.split(spec["entrypoint"])
    parsed = build_parser().parse_args(args)
    assert program == "raylm" and parsed.command in ("eval", "sweep")
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = head["containers"][0]["volumeMounts"][0]
    volume = next(v for v in head["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] in claims()
    assert parsed.output.is_relative_to(mount["mountPath"])


def test_cpu_head_autoscaled_gpu_workers_and_the_hint_that_names_them():
    spec = documents()["RayJob"]["spec"]
    cluster = spec["rayClusterSpec"]
    assert spec["shutdownAfterJobFinishes"] is True and cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    limits = {g["groupName"]: (g, g["template"]["spec"]["containers"][0]["resources"]["limits"])
              for g in cluster["workerGroupSpecs"]}
    assert all(g["minReplicas"] == 0 < g["maxReplicas"] and int(lim["nvidia.com/gpu"]) >= 1
               for g, lim in limits.values())
    hint = yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"][NODE_TYPES_ENV]
    types, max_added = parse_node_types(hint)
    assert types == tuple(NodeType(name, {"CPU": float(lim["cpu"]), "GPU": float(lim["nvidia.com/gpu"])},
                                   g["maxReplicas"]) for name, (g, lim) in limits.items())
    assert max_added == sum(g["maxReplicas"] for g, _ in limits.values())


# What EKS leaves a pod on the nodes rayjob.yaml is sized for (4 vCPU, 16 GiB: m5.xlarge for the head, g5.xlarge
# or g6.xlarge for a GPU worker): the machine less kubelet's reservations (80m CPU; 255 MiB + 11 MiB per pod at 58
# pods, and 100 MiB for eviction) is about 3.92 CPU and 14.4 GiB; the node's daemons (networking, kube-proxy, the EBS
# and NVIDIA plugins) take some of that too.
NODES = {"head": ("m5.xlarge",), "gpu-workers": ("g5.xlarge", "g6.xlarge")}
ALLOCATABLE_CPU, ALLOCATABLE_GIB = 3.92, 14.4


def quantity(value: str | int) -> float:
    """A Kubernetes CPU or memory quantity, as rayjob.yaml writes them ("3", "500m", "12Gi"), in CPUs or GiB."""
    text = str(value)
    units = {"m": 1e-3, "Gi": 1.0, "Mi": 1 / 1024}
    unit = next((u for u in units if text.endswith(u)), "")
    return float(text.removesuffix(unit)) * units.get(unit, 1.0)


def test_every_pod_fits_the_allocatable_of_the_nodes_it_is_sized_for():
    """A pod that asks for a whole 4-vCPU/16-GiB node is never scheduled on one. Requests equal limits (KubeRay tells
    Ray the limits), so what Ray counts is what the node reserved."""
    cluster = documents()["RayJob"]["spec"]["rayClusterSpec"]
    groups = {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}
    text = (REPO / "rayjob.yaml").read_text()
    assert set(groups) == set(NODES) and all(node in text for nodes in NODES.values() for node in nodes)
    for group in groups.values():
        [container] = group["template"]["spec"]["containers"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits
        assert quantity(requests["cpu"]) <= ALLOCATABLE_CPU - 0.5 and quantity(requests["memory"]) <= ALLOCATABLE_GIB - 1


def test_the_results_claim_names_the_ebs_storage_class_rayjob_yaml_creates():
    """EKS 1.30 and later have no default class: a claim without storageClassName stays Pending, and the head with
    it. The claim names gp3 through the EBS CSI driver, made where the head is scheduled; both docs name the driver
    as a prerequisite, and the NVIDIA device plugin, without which no pod gets an nvidia.com/gpu."""
    [storage_class] = [doc for doc in manifests() if doc["kind"] == "StorageClass"]
    assert storage_class["apiVersion"] == "storage.k8s.io/v1" and storage_class["provisioner"] == "ebs.csi.aws.com"
    assert storage_class["parameters"] == {"type": "gp3"}
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    assert {c["spec"]["storageClassName"] for c in claims().values()} == {storage_class["metadata"]["name"]}
    install_plugin = "helm install nvdp nvdp/nvidia-device-plugin"
    for text in ((REPO / "rayjob.yaml").read_text(), (REPO / "docs" / "cluster.md").read_text()):
        assert "EBS CSI driver" in text and install_plugin in text


def reading_commands(text: str) -> list[list[str]]:
    """The commands that read results off the claim, as a file shows them (comments' `#   ` dropped)."""
    lines = [line.strip().removeprefix("#").strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("kubectl ") and "raylm-results" in line
            and line.split()[1] in ("run", "wait", "cp", "delete")]


@pytest.mark.parametrize("path", ["rayjob.yaml", "docs/cluster.md"])
def test_results_are_read_off_the_claim_once_the_cluster_is_gone(path):
    """A pod mounts the claim where the head did, as the head's user, and `kubectl cp` copies the entrypoint's
    --output off it; then the pod goes."""
    run, wait, copy_off, delete = reading_commands((REPO / path).read_text())
    pod = run[2]
    assert run[:2] == ["kubectl", "run"] and "--restart=Never" in run
    spec = json.loads(next(w for w in run if w.startswith("--overrides=")).split("=", 1)[1])["spec"]
    [container] = spec["containers"]
    [volume] = spec["volumes"]
    [mount] = container["volumeMounts"]
    assert container["name"] == pod and mount["name"] == volume["name"]
    assert volume["persistentVolumeClaim"]["claimName"] in claims()
    head = pod_specs()[0]
    assert {k: v for k, v in head["securityContext"].items() if k != "fsGroup"} == spec["securityContext"]
    output = build_parser().parse_args(shlex.split(documents()["RayJob"]["spec"]["entrypoint"])[1:]).output
    [head_mount] = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == "results"]
    assert mount["mountPath"] == head_mount["mountPath"]
    assert wait[:3] == ["kubectl", "wait", "--for=condition=Ready"] and f"pod/{pod}" in wait
    assert copy_off[:2] == ["kubectl", "cp"] and copy_off[2] == f"{pod}:{output}"
    assert delete == ["kubectl", "delete", "pod", pod]
