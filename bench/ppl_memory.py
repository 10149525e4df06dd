"""Memory bound of `raylm ppl`: stream corpora 1x and 4x (both larger than Ray's object store) and compare peak
memory (PSS, so shared object-store pages are not counted twice) of the driver, the scoring actor, the other Ray
workers and Ray's own processes, sampled every 0.5 s while the stream runs.

If anything held the corpus (or its per-window requests) the 4x peak would be about four times the 1x peak;
streaming keeps it flat. The corpus is synthetic text over a word-level tokenizer whose 500 "words" are each
~100 characters long, so hundreds of MB pass through the real pipeline (Ray Data read -> tokenizer -> windows ->
Scorer -> per-document rows) in minutes on two shared cores; what is measured is bytes in flight, not model
speed.

    PYTHONPATH=$PWD python bench/ppl_memory.py [--mb 100] [--object-store-mb 80]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

WORDS = 500
WORD_CHARS = 100
DOC_WORDS = 2000  # ~200 KB per document


def make_model(path: Path) -> None:
    """A 1-layer random Llama on a word-level tokenizer (vocab 512, 1024-token context)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    rng = random.Random(0)
    for i in range(WORDS):
        vocab[f"w{i:03d}" + "".join(rng.choice("abcdefghij") for _ in range(WORD_CHARS - 4))] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            model_max_length=1024).save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)


def make_corpus(directory: Path, megabytes: int, words: list[str]) -> int:
    """Parquet shards of ~32 MB each, `megabytes` of text in all; returns the document count."""
    directory.mkdir(parents=True)
    rng = random.Random(megabytes)
    docs_per_shard = 32 * 1024**2 // (DOC_WORDS * (WORD_CHARS + 1))
    total_docs = megabytes * 1024**2 // (DOC_WORDS * (WORD_CHARS + 1))
    written = 0
    while written < total_docs:
        n = min(docs_per_shard, total_docs - written)
        texts = [" ".join(rng.choices(words, k=DOC_WORDS)) for _ in range(n)]
        pq.write_table(pa.table({"text": texts}), directory / f"shard-{written:08d}.parquet", row_group_size=8)
        written += n
    return total_docs


ROLES = ("driver", "scoring actor", "other Ray workers", "Ray system")


def role(p: psutil.Process, me: psutil.Process) -> str:
    if p.pid == me.pid:
        return "driver"
    title = " ".join(p.cmdline())
    if "MapWorker" in title:
        return "scoring actor"
    return "other Ray workers" if title.startswith("ray::") else "Ray system"


class MemorySampler(threading.Thread):
    """Every 0.5 s: PSS of this process and all its descendants (raylet, workers, actors, plasma), by role."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples: list[dict[str, tuple[int, int]]] = []

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.is_set():
            sample = {r: (0, 0) for r in ROLES}
            for p in [me, *me.children(recursive=True)]:
                try:
                    r, pss = role(p, me), p.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                count, total = sample[r]
                sample[r] = (count + 1, total + pss)
            self.samples.append(sample)
            self.stop.wait(0.5)


def measure(spec, data: Path, out: Path) -> dict[str, float]:
    from raylm.corpus.run import CorpusConfig, run_corpus

    sampler = MemorySampler()
    sampler.start()
    start = time.time()
    result = run_corpus(CorpusConfig(spec, str(data / "*.parquet"), progress=False), out)
    wall = time.time() - start
    sampler.stop.set()
    sampler.join()
    totals = [sum(pss for _, pss in s.values()) for s in sampler.samples]
    row = {"docs": result.metrics["docs"], "tokens": result.metrics["tokens"], "wall_s": wall,
           "total": max(totals) / 2**20, "samples": len(totals),
           # The scoring actor's PSS at each tenth of the run: a leak would climb, a bounded stream plateaus.
           "actor_tenths": [round(sampler.samples[min(len(totals) - 1, len(totals) * k // 10)]["scoring actor"][1]
                                  / 2**20) for k in range(1, 11)]}
    for r in ROLES:
        row[r] = max(s[r][1] for s in sampler.samples) / 2**20
        row[f"{r} n"] = max(s[r][0] for s in sampler.samples)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the 1x corpus in MB of text")
    parser.add_argument("--object-store-mb", type=int, default=80)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    import ray

    from raylm.models.spec import ModelSpec

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             object_store_memory=args.object_store_mb * 2**20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_model(root / "model")
        from transformers import AutoTokenizer

        words = [w for w in AutoTokenizer.from_pretrained(root / "model").get_vocab() if w.startswith("w")]
        spec = ModelSpec(str(root / "model"), dtype="float32", device="cpu")
        rows = {}
        for scale in (1, 4):
            docs = make_corpus(root / f"corpus-{scale}x", args.mb * scale, words)
            size = sum(f.stat().st_size for f in (root / f"corpus-{scale}x").iterdir()) / 2**20
            rows[scale] = {"text_mb": args.mb * scale, "parquet_mb": size, "docs_written": docs,
                           **measure(spec, root / f"corpus-{scale}x", root / f"out-{scale}x")}
            print(f"{scale}x done: {rows[scale]}", file=sys.stderr, flush=True)
    print(f"object store: {args.object_store_mb} MB; {os.cpu_count()} CPUs; 1 scoring actor; "
          "peak PSS in MB (processes)")
    print(f"{'corpus':<7} {'text MB':>8} {'tokens':>9} {'wall s':>7} {'all':>7} "
          + " ".join(f"{r:>22}" for r in ROLES))
    for scale, r in rows.items():
        print(f"{scale}x{'':<5} {r['text_mb']:>8} {r['tokens']:>9} {r['wall_s']:>7.0f} {r['total']:>7.0f} "
              + " ".join(f"{r[x]:>16.0f} ({r[x + ' n']:>3})" for x in ROLES))
    for scale, r in rows.items():
        print(f"{scale}x scoring actor PSS MB at each tenth of the run: {r['actor_tenths']}")
    one, four = rows[1], rows[4]
    print(f"ratio 4x/1x: corpus {four['text_mb'] / one['text_mb']:.1f}, tokens {four['tokens'] / one['tokens']:.2f}, "
          f"all {four['total'] / one['total']:.2f}, "
          + ", ".join(f"{x} {four[x] / one[x]:.2f}" for x in ROLES))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
