"""What Ray costs: the same shards scored by one Ray actor (`--actors 1`) and by the same Scorer in-process.

Ray start-up and actor start (which loads the model) are reported separately; the ratio compares scoring only,
best of --repeats rounds that alternate the two with Ray running throughout.

    PYTHONPATH=$PWD python bench/overhead.py --model stories --tasks hellaswag,winogrande
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, build_task_requests, model_path, print_table  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raylm.cluster.actors import score_shard  # noqa: E402
from raylm.cluster.runtime import connect, start_actors  # noqa: E402
from raylm.cluster.scheduler import run_shards  # noqa: E402
from raylm.config import EvalConfig  # noqa: E402
from raylm.models.context import resolve_max_length  # noqa: E402
from raylm.models.loading import load_model, load_tokenizer  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402
from raylm.requests.encoding import Encoder  # noqa: E402
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS, make_shards  # noqa: E402
from raylm.scoring.scorer import Scorer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stories")
    parser.add_argument("--tasks", default="hellaswag,winogrande")
    parser.add_argument("--rows", type=int, help="documents per task (default: all)")
    parser.add_argument("--quick", action="store_true", help="50 documents per task")
    parser.add_argument("--repeats", type=int, default=3, help="best of N, alternating in-process and Ray")
    args = parser.parse_args()
    rows = 50 if args.quick else args.rows
    spec = ModelSpec(str(model_path(args.model)), dtype="float32", device="cpu")
    tokenizer = load_tokenizer(spec)
    start = time.perf_counter()
    model = load_model(spec)
    load_s = time.perf_counter() - start
    max_length = resolve_max_length(model.config, tokenizer)
    cfg = EvalConfig(spec, tuple(args.tasks.split(",")), DATA, limit=rows)
    start = time.perf_counter()
    tables, _ = build_task_requests(cfg, Encoder(tokenizer, max_length))
    tokenize_s = time.perf_counter() - start
    shards = make_shards(tables, DEFAULT_SHARD_REQUESTS)
    n_req = sum(s.table.num_rows for s in shards)

    start = time.perf_counter()
    connect()
    ray_start_s = time.perf_counter() - start
    start = time.perf_counter()
    actors = start_actors(spec, 1, None)
    actor_start_s = time.perf_counter() - start

    torch.set_num_threads(os.cpu_count() or 1)  # what the single actor gets: all the node's CPUs
    scorer = Scorer(model, max_length)
    local_s = ray_s = float("inf")
    for _ in range(args.repeats):  # alternating, so both sides see the same moments of a noisy machine
        start = time.perf_counter()
        local = [score_shard(scorer, s.kind, s.table) for s in shards]
        local_s = min(local_s, time.perf_counter() - start)
        start = time.perf_counter()
        remote = run_shards(actors, shards, progress=False).results
        ray_s = min(ray_s, time.perf_counter() - start)
    same = all(a.table["loglikelihood"].equals(b.table["loglikelihood"]) for a, b in zip(local, remote))

    print_table(f"{args.model}, {args.tasks}: {n_req} requests in {len(shards)} shards",
                ["stage", "seconds", "requests/s", "Ray / in-process"],
                [["tokenise (driver)", tokenize_s, n_req / tokenize_s, ""],
                 ["load model (in-process)", load_s, "", ""],
                 ["Ray start-up (connect)", ray_start_s, "", ""],
                 ["actor start + model load", actor_start_s, "", ""],
                 [f"score in-process (best of {args.repeats})", local_s, n_req / local_s, 1.0],
                 [f"score on 1 Ray actor (best of {args.repeats})", ray_s, n_req / ray_s, ray_s / local_s]])
    print(f"\nlog-likelihoods bit-identical in-process and on the actor: {same}")


if __name__ == "__main__":
    main()
