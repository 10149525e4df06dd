"""cluster.yaml is a launcher config `ray up` accepts: it validates against the autoscaler's own JSON schema,
shipped inside the installed ray package, and describes GPU workers that install raylm."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import ray
import yaml

from raylm.cluster.capacity import HEAD_RESOURCE, NODE_TYPES_ENV, capacity_of, node_types_from_config
from raylm.cluster.placement import Ask, plan

REPO = Path(__file__).resolve().parents[1]


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


def test_gpu_workers_autoscale_and_install_raylm():
    config = load()
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu and all(0 <= t["min_workers"] <= t["max_workers"] <= config["max_workers"] for t in gpu)
    assert any("raylm" in command and "pip install" in command for command in config["setup_commands"])


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
