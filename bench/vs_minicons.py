"""raylm against minicons (MaskedLMScorer, the tool people use for PLL today) on the same masked LM and the same
HellaSwag requests, both PLL variants, whole-command wall time, alternating, best of N; scores checked equal.

    PYTHONPATH=$PWD python bench/vs_minicons.py --model bert-base --rows 200 --repeats 3
    PYTHONPATH=$PWD python bench/vs_minicons.py --model tiny --rows 3          # a check that it all runs

The model (bench/masked_models.py) is BERT-base-shaped (12 x 768, 30522-entry WordPiece trained offline on the
shared text) with seeded random weights, or a 2-layer "tiny" one; both are cached under RAYLM_BENCH_CACHE.
minicons 0.3.39 needs transformers < 5, so it gets its own virtual environment (made on first use under the same
cache, torch pinned to this one's version) and runs there as its own command (bench/minicons_score.py); raylm
runs as `raylm eval --tasks hellaswag --limit ROWS --pll VARIANT`, one local actor on every core.

Agreement: both score the same tokens (the counts are checked) with the same definitions; minicons casts each
token's score to float32 and raylm sums float32 log-probabilities in float64, so request sums agree to about
1e-8 relative, not bit for bit.

Exact PLL leaves no work to share: every masked copy runs the encoder over every token on both sides. raylm's
savings are the head (run at one position per copy instead of every position) and padding, so the bench counts
both tools' multiply-adds on these requests and prints that bound next to the measured ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow.parquet as pq  # noqa: E402
from common import CACHE, DATA, print_table, raylm_cmd, timed  # noqa: E402
from masked_models import masked_model  # noqa: E402

VARIANTS = ("original", "word-l2r")
MINICONS_PINS = ("transformers>=4.57,<4.58", "minicons==0.3.39")
AGREEMENT_REL = 1e-6


def hellaswag_pairs(rows: int) -> list[tuple[list[tuple[str, str]], int]]:
    """Per document, its (context, continuation) requests as raylm's HellaSwag task builds them, and the gold."""
    from raylm.tasks.hellaswag import load_docs

    return [(list(zip(d.contexts, d.continuations)), d.gold) for d in load_docs(DATA)[:rows]]


def minicons_python(venv: Path) -> Path:
    """minicons' own environment, created on first use with this environment's torch version (no CUDA pulled)."""
    python = venv / "bin" / "python"
    if not python.exists():
        import torch

        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch.__version__.split('+')[0]}",
                        *MINICONS_PINS], check=True)
    return python


def encoder_flops(config, width: int) -> float:
    """Per token of a row `width` long: QKV and output projections, the MLP, attention scores and values."""
    h, m = config.hidden_size, config.intermediate_size
    return 2.0 * config.num_hidden_layers * (4 * h * h + 2 * h * m + 2 * h * width)


def head_flops(config) -> float:
    """Per position: the transform and the vocabulary projection."""
    return 2.0 * (config.hidden_size ** 2 + config.hidden_size * config.vocab_size)


def counted_work(model: Path, pairs: list[tuple[str, str]], minicons_batch: int) -> tuple[float, float]:
    """(raylm, minicons) multiply-adds x 2 on these requests. raylm: its own batches (the token budget the actor
    uses), each row padded to its batch's widest, the head at one position per copy. minicons: every copy of a
    call's sentences padded to the call's longest sentence, the head at every position."""
    from transformers import AutoConfig, AutoTokenizer

    from raylm.models.context import masked_max_length
    from raylm.requests.masked import UNSCORED, MaskedEncoder
    from raylm.scoring.batching import budget_batches
    from raylm.scoring.scorer import cpu_token_budget

    config, tokenizer = AutoConfig.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    requests = MaskedEncoder(tokenizer, masked_max_length(config, tokenizer)).encode_pairs(pairs)
    copies = [sum(w != UNSCORED for w in r.word_ids) for r in requests]
    widths = [w for r, n in zip(requests, copies) for w in [r.length] * n]
    ours = sum(len(batch) * (batch[0] * encoder_flops(config, batch[0]) + head_flops(config))
               for batch in budget_batches(widths, lambda w: w, cpu_token_budget(config)))
    theirs = 0.0
    for i in range(0, len(requests), minicons_batch):
        width = max(r.length for r in requests[i:i + minicons_batch])
        theirs += sum(copies[i:i + minicons_batch]) * width * (encoder_flops(config, width) + head_flops(config))
    return ours, theirs


def agreement(ours: list[float], ours_tokens: list[int], theirs: list[list[float]],
              docs: list[tuple[list[tuple[str, str]], int]]) -> tuple[str, bool]:
    counts = [len(t) for t in theirs]
    if counts != ours_tokens:
        return f"scored different tokens ({sum(counts)} vs {sum(ours_tokens)})", False
    sums = [math.fsum(t) for t in theirs]
    worst_abs = max(abs(a - b) for a, b in zip(ours, sums))
    worst_rel = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(ours, sums))
    preds, start = [], 0
    for requests, _ in docs:
        n = len(requests)
        preds.append((max(range(n), key=lambda j: ours[start + j]), max(range(n), key=lambda j: sums[start + j])))
        start += n
    differ = sum(a != b for a, b in preds)
    ok = worst_rel <= AGREEMENT_REL and differ == 0
    return (f"{len(ours)} requests, {sum(counts)} tokens: max |dPLL| {worst_abs:.1e}, max rel {worst_rel:.1e}, "
            f"predictions {'identical' if differ == 0 else f'{differ}/{len(preds)} differ'}"
            f" ({'ok' if ok else 'DIFFERS'})"), ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base", choices=("bert-base", "tiny"))
    parser.add_argument("--rows", type=int, default=200, help="HellaSwag documents (4 requests each)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each tool; best of N")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated PLL variants")
    parser.add_argument("--minicons-batch-size", type=int, default=1,
                        help="requests per minicons call (1 pads least, so it is minicons' fastest on CPU)")
    parser.add_argument("--minicons-venv", type=Path, default=CACHE / "minicons-venv")
    args = parser.parse_args()
    model = masked_model(args.model)
    python = minicons_python(args.minicons_venv)
    docs = hellaswag_pairs(args.rows)
    pairs = [p for requests, _ in docs for p in requests]
    ours_flops, theirs_flops = counted_work(model, pairs, args.minicons_batch_size)
    work = Path(tempfile.mkdtemp(prefix="raylm-vs-minicons-"))
    table, checks, failed = [], [], False
    for variant in args.variants.split(","):
        job = work / f"{variant}.json"
        job.write_text(json.dumps({"model": str(model), "variant": variant, "batch_size": args.minicons_batch_size,
                                   "threads": os.cpu_count(), "pairs": pairs}))
        theirs_out = work / f"minicons-{variant}.json"
        minicons = [str(python), str(Path(__file__).resolve().parent / "minicons_score.py"), str(job), str(theirs_out)]
        theirs_walls, ours_walls = [], []
        for i in range(args.repeats):
            theirs_walls.append(timed(minicons, f"minicons {variant}"))
            # A fresh output directory each time: reusing one would resume from the previous run's checkpoint.
            ours_walls.append(timed(raylm_cmd(model, "hellaswag", args.rows, work / f"raylm-{variant}-{i}") +
                                    ["--pll", variant], f"raylm {variant}"))
        samples = pq.read_table(work / f"raylm-{variant}-0" / "samples" / "hellaswag.parquet").sort_by(
            [("doc_id", "ascending"), ("req_idx", "ascending")])
        result = json.loads(theirs_out.read_text())
        line, ok = agreement(samples["loglikelihood"].to_pylist(), samples["continuation_tokens"].to_pylist(),
                             result["token_scores"], docs)
        failed |= not ok
        checks.append(f"{variant}: {line}; runs: minicons {', '.join(f'{w:.1f}' for w in theirs_walls)} s, raylm "
                      f"{', '.join(f'{w:.1f}' for w in ours_walls)} s")
        best_theirs, best_ours = min(theirs_walls), min(ours_walls)
        table += [[variant, f"minicons {result['minicons']} (transformers {result['transformers']})", best_theirs,
                   1.0, ""],
                  [variant, "raylm eval --actors 1", best_ours, best_theirs / best_ours,
                   f"{theirs_flops / ours_flops:.2f}x"]]
    print_table(f"{args.model}: raylm vs minicons on {args.rows} HellaSwag rows ({len(pairs)} requests), "
                f"whole-command wall time (best of {args.repeats}), {os.cpu_count()} CPUs",
                ["PLL", "tool", "wall s", "minicons / tool", "counted-work bound"], table)
    print(f"\ncounted work: raylm {ours_flops / 1e12:.2f} TFLOP, minicons ({args.minicons_batch_size} request(s) per "
          f"call) {theirs_flops / 1e12:.2f} TFLOP: scoring alone can be at most {theirs_flops / ours_flops:.2f}x "
          "faster than minicons here; whole-command ratios also carry each tool's start-up")
    print("\n" + "\n".join(checks))
    if failed:
        sys.exit("scores differ between raylm and minicons")


if __name__ == "__main__":
    main()
