"""Run by test_node_loss.py in its own process: a head and two worker nodes, one removed mid-run.

`ray.cluster_utils.Cluster` cannot share a process with the test session's Ray, hence the separate script. It
prints one JSON line of facts for the test to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from raylm.cluster.runtime import start_actors
from raylm.config import EvalConfig
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec

TASKS = ("hellaswag", "winogrande", "wikitext")
STORE_BYTES = 100 * 1024**2


def node_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))


def main(model_dir: str, data_dir: str) -> None:
    # The head has no CPUs, so both actors land on workers, one each, and the replacement for the actor on the
    # removed node finds no room: the run must finish on the surviving node alone.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE_BYTES})
    workers = [cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    spec = ModelSpec(model_dir, dtype="float32", device="cpu")
    cfg = EvalConfig(spec, TASKS, Path(data_dir), limit=8, shard_requests=4, progress=False)
    actors = start_actors(spec, 2, None)
    undisturbed = evaluate(cfg, actors)
    nodes = {ray.get(a.ready.remote()): node_of(a) for a in actors}
    removed: list[str] = []

    def remove_the_other_node(shard, scored) -> None:
        if not removed:
            victim = next(node for pid, node in nodes.items() if pid != scored.pid)
            cluster.remove_node(next(w for w in workers if w.node_id == victim))
            removed.append(victim)

    disturbed = evaluate(cfg, actors, on_shard=remove_the_other_node)
    survivors = {node_of(a) for a in actors}
    keys = {name: list(zip(t.scored["doc_id"].to_pylist(), t.scored["req_idx"].to_pylist()))
            for name, t in disturbed.tasks.items()}
    print(json.dumps({
        "actor_nodes": len(set(nodes.values())),
        "removed": len(removed),
        "shards": disturbed.extra["shards"],
        "retried": disturbed.extra["shards_retried"],
        "replaced": disturbed.extra["actors_replaced"],
        "identical": all(disturbed.tasks[n].scored.equals(undisturbed.tasks[n].scored)
                         and disturbed.tasks[n].metrics == undisturbed.tasks[n].metrics for n in TASKS),
        "counted_once": all(len(k) == len(set(k)) for k in keys.values()),
        "survivors_on_remaining_nodes": bool(survivors) and not survivors & set(removed),
    }))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
