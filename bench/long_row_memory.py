"""Peak memory of scoring one long rolling row on a large-vocabulary model: raylm at REV against raylm now.

The row is what a long-context model makes of a WikiText article when nothing caps it: one context token and
every later position predicting (a rolling window), here 15,000 tokens on a Llama-3-sized vocabulary (128,256)
with a tiny body, so the logits are all there is to measure: 15,000 x 128,256 float32 logits are 7.7 GB. Each
variant runs in its own process (peak RSS from getrusage), the source of REV unpacked from git; both must give
the same loglikelihood.

    PYTHONPATH=$PWD python bench/long_row_memory.py --before 34dcc67 [--tokens 15000] [--vocab 128256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Run with cwd=source, since `python -c` puts the working directory first on sys.path.
SCORE = """
import json, resource, sys, time
import raylm
assert raylm.__file__.startswith(sys.argv[3]), raylm.__file__
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from raylm.scoring.scorer import Scorer
tokens, vocab = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(2)
config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens + 1)
model = LlamaForCausalLM(config).eval()
row = torch.randint(3, vocab, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()
start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
loglik, _ = Scorer(model, tokens).score([row[:1]], [row[1:]])
peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"loglik": float(loglik[0]), "wall_s": time.perf_counter() - start,
                  "model_rss_mb": start_rss / 1024, "peak_rss_mb": peak_rss / 1024}))
"""


def run(source: Path, tokens: int, vocab: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCORE, str(tokens), str(vocab), str(source)], capture_output=True, text=True,
                          cwd=source, env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"}, check=False)
    if proc.returncode != 0:
        sys.exit(f"scoring with {source} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision to compare against (its raylm/ is unpacked)")
    parser.add_argument("--tokens", type=int, default=15000)
    parser.add_argument("--vocab", type=int, default=128256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raylm-before-") as before:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "raylm"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        old = run(Path(before), args.tokens, args.vocab)
    new = run(REPO, args.tokens, args.vocab)
    logits_gb = args.tokens * args.vocab * 4 / 1e9
    rows = [[f"raylm {args.before}", old["model_rss_mb"], old["peak_rss_mb"], old["wall_s"], old["loglik"]],
            ["raylm now", new["model_rss_mb"], new["peak_rss_mb"], new["wall_s"], new["loglik"]],
            ["now / before", new["model_rss_mb"] / old["model_rss_mb"], new["peak_rss_mb"] / old["peak_rss_mb"],
             new["wall_s"] / old["wall_s"], new["loglik"] - old["loglik"]]]
    print_table(f"one {args.tokens}-token rolling row, vocabulary {args.vocab} ({logits_gb:.1f} GB of float32 "
                "logits in one pass)", ["scorer", "RSS before scoring MB", "peak RSS MB", "wall s",
                                        "loglikelihood (last row: difference)"], rows)


if __name__ == "__main__":
    main()
