"""Throughput and agreement of `raylm ppl` against lm-evaluation-harness's rolling loglikelihood, same text,
side by side in one run.

lm-eval: HFLM(pretrained=..., batch_size=...).loglikelihood_rolling on Instance objects, one per document,
timed after the model is loaded. raylm: run_corpus on the same documents written to Parquet, on an already
running local Ray, timed end to end (so its time includes starting the Ray Data actor and loading the model
there). Default text: the first WikiText-2 test articles as the WikiText task feeds them to the model.
The two agree to float rounding only for a tokenizer that adds no BOS: lm-eval also scores a BOS-adding
tokenizer's BOS after its prefix BOS, which `raylm ppl` lets condition instead.

    PYTHONPATH=$PWD python bench/ppl_vs_lmeval.py [--model DIR] [--pages 12] [--batch-size 16] [--actors 1]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, STORIES  # noqa: E402


def run_lmeval(model: str, texts: list[str], batch_size: int) -> tuple[list[float], float]:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, device="cpu", dtype="float32", batch_size=batch_size)
    requests = [Instance(request_type="loglikelihood_rolling", doc={"text": t}, arguments=(t,), idx=i)
                for i, t in enumerate(texts)]
    start = time.time()
    loglik = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    return [float(x) for x in loglik], time.time() - start


def run_raylm(model: str, texts: list[str], actors: int, tmp: Path) -> tuple[list[float], int, float]:
    from raylm.corpus.run import CorpusConfig, run_corpus
    from raylm.models.spec import ModelSpec

    pq.write_table(pa.table({"text": texts}), tmp / "docs.parquet")
    start = time.time()
    result = run_corpus(CorpusConfig(ModelSpec(model, "float32", "cpu"), str(tmp / "docs.parquet"), actors=actors,
                                     progress=False), tmp / "out")
    wall = time.time() - start
    docs = pq.read_table(tmp / "out" / "samples" / "ppl.parquet")
    return [-x for x in docs["nll"].to_pylist()], int(result.metrics["tokens"]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STORIES))
    parser.add_argument("--pages", type=int, default=12, help="WikiText-2 test articles")
    parser.add_argument("--batch-size", type=int, default=16, help="lm-eval's batch size")
    parser.add_argument("--actors", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    import ray

    from raylm.tasks.wikitext import load_docs

    texts = [d.text for d in load_docs(DATA)[: args.pages]]
    lm_loglik, lm_wall = run_lmeval(args.model, texts, args.batch_size)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as tmp:
        ray_loglik, tokens, ray_wall = run_raylm(args.model, texts, args.actors, Path(tmp))
    ray.shutdown()
    worst = max(abs(a - b) / abs(b) for a, b in zip(ray_loglik, lm_loglik))
    total_rel = abs(math.fsum(ray_loglik) - math.fsum(lm_loglik)) / abs(math.fsum(lm_loglik))
    print(f"model {args.model}; {len(texts)} documents, {tokens} tokens; {os.cpu_count()} CPUs")
    print(f"{'runner':<34} {'wall s':>8} {'tokens/s':>10} {'token ppl':>12}")
    for name, wall, loglik in ((f"lm-eval HFLM batch {args.batch_size}", lm_wall, lm_loglik),
                               (f"raylm ppl, {args.actors} actor(s), incl. start", ray_wall, ray_loglik)):
        print(f"{name:<34} {wall:>8.1f} {tokens / wall:>10.0f} {math.exp(-math.fsum(loglik) / tokens):>12.6f}")
    print(f"speed ratio raylm/lm-eval: {lm_wall / ray_wall:.2f}x")
    print(f"agreement: worst per-document relative difference {worst:.2e}, total NLL {total_rel:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
