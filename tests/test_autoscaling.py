"""CLUSTER TEST (~60 s): `ray job submit -- raylm eval` on Ray's own fake autoscaler, shaped like cluster.yaml: a
head with no CPU for actors and no GPU, and GPU workers the autoscaler adds from zero (min_workers: 0). The small
demo run asks for the one GPU actor its work needs (the autoscaler adds one node of the two it could), and the same
command on its finished output starts no actor and adds no node.

The head runs `RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=...` (the v1 autoscaler `ray up` runs) on
its own ports and --temp-dir, in its own process group, which is killed afterwards (never `ray stop`, never
AutoscalingCluster, which runs `ray stop --force`). As cluster.yaml does, the head is started with
RAYLM_NODE_TYPES naming the autoscaling config, and the driver sees it through the job's environment. The fake GPUs
have no CUDA device, so the job sets the RAYLM_FAKE_GPUS drill switch and its GPU actors compute on CPU.
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

from raylm.cluster.capacity import NODE_TYPES_ENV
from raylm.cluster.devices import FAKE_GPUS_ENV
from test_job_submit import (REPO, alive_nodes, assert_equals_local_run, demo_args, head_ports, ray_head,
                             short_temp_dir, submit)

pytestmark = pytest.mark.cluster

GPU_WORKERS = 2  # what the cluster can grow to
PLACEMENT_LINE = ("placement: 1 actor x 1 GPU (0.5 CPU each): what the work needs (54,988 tokens left in 3 shards x "
                  "260K parameters ~ <0.1 actor-minutes at 40 TFLOP/s per GPU actor, 10 min each), fewer than one "
                  f"per GPU the cluster can grow to ({GPU_WORKERS}); --device auto: no GPU up yet; the autoscaler may "
                  f"add gpu_worker nodes (from {NODE_TYPES_ENV})")
FINISHED_LINE = "placement: no actor: nothing left to score (every shard is in the checkpoint)"


def fake_cluster_config(gcs_address: str) -> dict:
    """cluster.yaml's head and GPU worker type, on the fake provider and at a test's size ({CPU: 2, GPU: 1})."""
    shipped = yaml.safe_load((REPO / "cluster.yaml").read_text())
    head = shipped["available_node_types"][shipped["head_node_type"]]
    worker = shipped["available_node_types"]["gpu_worker"]
    assert head["resources"] == {"CPU": 0} and worker["min_workers"] == 0 and worker["resources"]["GPU"] == 1
    return {
        "cluster_name": "raylm-fake", "max_workers": GPU_WORKERS, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        # As Ray's fake_multi_node/example.yaml (not shipped in the wheel): nodes known by id, never "updated".
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "launch_multiple": True,
                     "use_node_id_as_ip": True, "disable_node_updaters": True, "disable_launch_config_check": True},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "ray.head.default": {"resources": head["resources"], "node_config": {}, "max_workers": 0},
            "gpu_worker": {"resources": {"CPU": 2, "GPU": 1}, "node_config": {}, "min_workers": 0,
                           "max_workers": GPU_WORKERS},
        },
        "head_node_type": "ray.head.default",
        **{key: [] for key in ("cluster_synced_files", "rsync_exclude", "rsync_filter", "initialization_commands",
                               "setup_commands", "head_setup_commands", "worker_setup_commands",
                               "head_start_ray_commands", "worker_start_ray_commands")},
        "file_mounts": {}, "file_mounts_sync_continuously": False,
    }


def scoring_actors(address: str) -> list[dict]:
    """The job's scoring actors as Ray's state API records them (dead ones included)."""
    with urllib.request.urlopen(f"{address}/api/v0/actors?detail=1&limit=1000", timeout=10) as response:
        actors = json.loads(response.read())["data"]["result"]["result"]
    return [a for a in actors if a["class_name"] == "ScoringActor"]


def test_raylm_eval_asks_for_the_gpu_actors_its_work_needs_and_the_autoscaler_adds_their_nodes(tmp_path):
    temp_dir = short_temp_dir()
    ports = head_ports()
    config = temp_dir / "autoscaling.yaml"
    config.write_text(yaml.safe_dump(fake_cluster_config(f"127.0.0.1:{ports['port']}")))
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", NODE_TYPES_ENV: str(config),
           "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}  # the id the fake provider knows the head by
    out = tmp_path / "out"
    job_env = ["--runtime-env-json", json.dumps({"env_vars": {FAKE_GPUS_ENV: "1"}})]
    try:
        with ray_head(temp_dir, num_cpus=0, ports=ports, extra_args=(f"--autoscaling-config={config}",),
                      env_extra=env) as (address, _):
            # No --working-dir: the fake nodes share the head's session directory, where each would unpack it
            # again (see test_job_submit); every node runs this checkout's installed raylm.
            log = submit(address, job_env, demo_args(out))
            nodes, actors = alive_nodes(address), scoring_actors(address)
            # The same command on its finished output (a rerun to add --decontaminate, say).
            rerun_log = submit(address, job_env, demo_args(out))
            nodes_after, actors_after = alive_nodes(address), scoring_actors(address)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert PLACEMENT_LINE in log, log[-3000:]
    assert PLACEMENT_LINE in (REPO / "docs" / "cluster.md").read_text()  # the docs quote this run
    assert nodes == 2  # the head and the one GPU node the actor needs, of the GPU_WORKERS it could have had
    assert [a["required_resources"] for a in actors] == [{"CPU": 0.5, "GPU": 1.0}]
    assert f"{FAKE_GPUS_ENV}=1: computing on CPU although Ray gave this actor GPU(s)" in log
    assert FINISHED_LINE in rerun_log, rerun_log[-3000:]
    assert FINISHED_LINE in (REPO / "docs" / "cluster.md").read_text()
    assert (nodes_after, len(actors_after)) == (nodes, len(actors))  # no actor started, no node added
    assert_equals_local_run(json.loads((out / "results.json").read_text()))
