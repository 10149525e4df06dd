"""rayjob.yaml is a RayJob the Kubernetes API server accepts once KubeRay is installed: it validates against
KubeRay's own CRD schema (vendored in tests/kuberay/, with its source and licence), read as the API server's strict
field validation reads it (an unknown field is an error, not silently dropped); its runtime environment is one Ray
accepts; its entrypoint is a raylm command; and the placement hint it passes says what its worker group is.

The schema's CEL rules (x-kubernetes-validations) are not evaluated here; they concern fields the manifest does not
use (deletionStrategy, managedBy, gcsFaultToleranceOptions).
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.runtime_env import RuntimeEnv

from raylm.cli import build_parser
from raylm.cluster.capacity import NODE_TYPES_ENV, NodeType, parse_node_types

REPO = Path(__file__).resolve().parents[1]
SCHEMA = Path(__file__).parent / "kuberay" / "ray.io_rayjobs.v1.schema.json"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((REPO / "rayjob.yaml").read_text())}


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


def test_runtime_env_is_one_ray_accepts_and_installs_raylm():
    env = yaml.safe_load(documents()["RayJob"]["spec"]["runtimeEnvYAML"])
    RuntimeEnv(**env)  # Ray's own validation of each field
    assert any(p.split("[")[0] == "raylm" for p in env["pip"])


def test_entrypoint_is_a_raylm_command_writing_to_the_results_volume():
    docs = documents()
    spec = docs["RayJob"]["spec"]
    program, *args = shlex.split(spec["entrypoint"])
    parsed = build_parser().parse_args(args)
    assert program == "raylm" and parsed.command in ("eval", "sweep")
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = head["containers"][0]["volumeMounts"][0]
    volume = next(v for v in head["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]
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
