"""Soak: back-to-back evaluations in one Ray session on the same resident actors, watching memory.

A long sweep reuses its actors for hours, so any per-run leak (Arrow shards, object refs, cached tensors) adds
up. This runs the same evaluation N times on one actor pool and prints driver and actor RSS after the first run
(warm: model loaded, allocators settled) and after the last, with their ratio, and checks every run's metrics
are identical.

    PYTHONPATH=. python bench/soak.py [--runs 10] [--limit 100] [--actors 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import psutil
import ray

from raylm.cluster.runtime import start_actors
from raylm.config import EvalConfig
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec

MAX_GROWTH = 1.10


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--actors", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=256 * 1024**2,
             log_to_driver=False)
    spec = ModelSpec(str(DEMO_MODEL), dtype="float32", device="cpu")
    cfg = EvalConfig(spec, ("hellaswag", "winogrande", "wikitext"), DEMO_DATA, limit=args.limit,
                     shard_requests=64, progress=False)
    actors = start_actors(spec, args.actors, None)
    pids = ray.get([a.ready.remote() for a in actors])
    driver = os.getpid()
    before = {"driver": rss_mib(driver), **{f"actor {i}": rss_mib(p) for i, p in enumerate(pids)}}
    metrics, walls, warm, driver_trace = [], [], {}, []
    for run in range(args.runs):
        start = time.perf_counter()
        result = evaluate(cfg, actors)
        walls.append(time.perf_counter() - start)
        metrics.append({name: t.metrics for name, t in result.tasks.items()})
        driver_trace.append(rss_mib(driver))
        if run == 0:
            warm = {"driver": rss_mib(driver), **{f"actor {i}": rss_mib(p) for i, p in enumerate(pids)}}
    end = {"driver": rss_mib(driver), **{f"actor {i}": rss_mib(p) for i, p in enumerate(pids)}}
    assert ray.get([a.ready.remote() for a in actors]) == pids, "an actor was replaced during the soak"
    requests = result.extra["requests_scored"]
    print(f"{args.runs} evaluations x {requests} requests ({args.limit} docs per task), {args.actors} actors, "
          f"wall per run first {walls[0]:.1f} s, last {walls[-1]:.1f} s")
    print(f"{'process':<10} {'before MiB':>11} {'after run 1':>12} {f'after run {args.runs}':>13} {'end/run 1':>10}")
    worst = 0.0
    for name in end:
        ratio = end[name] / warm[name]
        worst = max(worst, ratio)
        print(f"{name:<10} {before[name]:11.1f} {warm[name]:12.1f} {end[name]:13.1f} {ratio:10.3f}")
    print("driver MiB after each run: " + " ".join(f"{m:.0f}" for m in driver_trace))
    identical = all(m == metrics[0] for m in metrics)
    print(f"metrics identical across runs: {identical}; worst growth {100 * (worst - 1):+.1f} % "
          f"(limit {100 * (MAX_GROWTH - 1):.0f} %)")
    ray.shutdown()
    return 0 if identical and worst <= MAX_GROWTH else 1


if __name__ == "__main__":
    raise SystemExit(main())
