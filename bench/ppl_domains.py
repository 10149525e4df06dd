"""Per-domain perplexity at scale: whole `raylm ppl --domain-column` commands (checkpointing as they go) against
lm-evaluation-harness's rolling loglikelihood and a bare forward pass over the same windows.

Text of very different lengths in two domains: whole WikiText-2 articles ("articles") and its single paragraphs
("paragraphs"), written as gzip'd JSONL with a `domain` column. Model: the 124M GPT-2 shape (random init, seeded)
with the GPT-2 tokenizer, 1024-token disjoint windows (lm-eval's rolling windows). Four runs, each timed as a
whole (process start, model load, scoring):

- raylm: `raylm ppl --domain-column domain --checkpoint-every 60` in its own process (and its own local Ray);
- raylm sweep: a sweep file with that model and the corpus under `corpora:`, scored on the sweep's resident actor
  (checkpointing every 60 s too), in its own process;
- lm-eval 0.4.13: HFLM(batch_size=16).loglikelihood_rolling over the same documents, in its own process;
- bare forward: the same windows, longest first, 16 to a padded batch, through the model in this process, timed
  after loading (the floor any runner pays).

It prints a table of wall times and tokens/s, then the ratios: raylm (and the sweep) vs lm-eval speed, their
tokens/s vs the bare forward's, and the bits-per-byte difference from lm-eval per domain and for the macro
average.

    PYTHONPATH=$PWD python bench/ppl_domains.py --articles 40 [--device cuda] [--batch-size 16]

--articles sets the size: that many articles and eight times as many paragraphs (--articles 4 is a smoke run
of a minute or two on a CPU; 40 takes a few minutes on one GPU).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DATA, GPT2_TOKENIZER

MAX_LENGTH = 1024


def corpus(articles: int) -> dict[str, list[str]]:
    """WikiText-2 test articles, and paragraphs (non-heading lines) from the articles after them."""
    from raylm.tasks.wikitext import load_docs

    pages = [d.text for d in load_docs(DATA)]
    paragraphs = [line.strip() for page in pages[articles:] for line in page.splitlines()
                  if line.strip() and not line.strip().startswith("=")]
    return {"articles": pages[:articles], "paragraphs": paragraphs[:8 * articles]}


def write_model(path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
    AutoTokenizer.from_pretrained(GPT2_TOKENIZER).save_pretrained(path)


def lmeval_worker(model: str, docs: str, out: str, device: str, batch_size: int) -> None:
    """The lm-eval side, run in a process of its own so that its time includes the model load."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    rows = [json.loads(line) for line in gzip.open(docs, "rt", encoding="utf-8")]
    lm = HFLM(pretrained=model, device=device, dtype="float32", batch_size=batch_size, max_length=MAX_LENGTH)
    requests = [Instance("loglikelihood_rolling", {}, (r["text"],), i) for i, r in enumerate(rows)]
    loglik = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    Path(out).write_text(json.dumps([float(x) for x in loglik]))


def bare_forward(model_dir: str, texts: list[str], device: str, batch_size: int) -> tuple[int, float]:
    """Tokens scored and seconds for the windows alone: (tokens, wall) after the model is loaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raylm.requests.windows import strided_windows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    # (model input + the last token, tokens scored): a document's last window is a full context with a short
    # continuation, as in lm-eval's rolling windows
    windows = [(c + k, len(k)) for t in texts
               for c, k in strided_windows(tokenizer(t)["input_ids"], tokenizer.eos_token_id, MAX_LENGTH, MAX_LENGTH)]
    windows.sort(key=lambda w: len(w[0]), reverse=True)
    start = time.time()
    tokens = 0
    with torch.inference_mode():
        for i in range(0, len(windows), batch_size):
            batch = [w for w, _ in windows[i:i + batch_size]]
            width = len(batch[0]) - 1
            ids = torch.tensor([w[:-1] + [0] * (width - len(w) + 1) for w in batch], device=device)
            mask = torch.tensor([[1] * (len(w) - 1) + [0] * (width - len(w) + 1) for w in batch], device=device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            torch.log_softmax(logits.float(), -1).sum().item()  # the log-probs every runner computes
            tokens += sum(scored for _, scored in windows[i:i + batch_size])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return tokens, time.time() - start


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.time()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(command[:4])} ... failed:\n{proc.stderr[-3000:]}")
    return time.time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=40, help="size: articles (and 8x as many paragraphs)")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--batch-size", type=int, default=16, help="lm-eval's and the bare forward's batch size")
    parser.add_argument("--lmeval-worker", nargs=3, metavar=("MODEL", "DOCS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lmeval_worker:
        lmeval_worker(*args.lmeval_worker, args.device, args.batch_size)
        return 0
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    domains = corpus(args.articles)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "gpt2-124m"
        write_model(model)
        docs = tmp / "docs.jsonl.gz"
        with gzip.open(docs, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t, "domain": d}) + "\n" for d, texts in domains.items() for t in texts)
        ray_wall = timed([sys.executable, "-m", "raylm", "ppl", "--model", str(model), "--data", str(docs),
                          "--domain-column", "domain", "--checkpoint-every", "60", "--dtype", "float32",
                          "--device", args.device, "--output", str(tmp / "out"), "--no-progress"], env)
        results = json.loads((tmp / "out" / "results.json").read_text())["results"]["ppl"]
        (tmp / "sweep.yaml").write_text(json.dumps({
            "models": [{"path": str(model), "name": "gpt2", "dtype": "float32"}], "device": args.device,
            "corpora": [{"name": "mix", "data": str(docs), "domain_column": "domain"}]}))
        sweep_wall = timed([sys.executable, "-m", "raylm", "sweep", str(tmp / "sweep.yaml"), "--output",
                            str(tmp / "sweep")], env)
        swept = json.loads((tmp / "sweep" / "gpt2" / "corpus-mix" / "results.json").read_text())["results"]["ppl"]
        lm_wall = timed([sys.executable, __file__, "--device", args.device, "--batch-size", str(args.batch_size),
                         "--lmeval-worker", str(model), str(docs), str(tmp / "lmeval.json")], env)
        loglik = json.loads((tmp / "lmeval.json").read_text())
        tokens, bare_wall = bare_forward(str(model), [t for texts in domains.values() for t in texts], args.device,
                                         args.batch_size)
    assert tokens == results["tokens"] == swept["tokens"], (tokens, results["tokens"], swept["tokens"])
    lm_bpb, start = {}, 0
    for name, texts in domains.items():
        nll = -math.fsum(loglik[start:start + len(texts)])
        lm_bpb[name] = nll / sum(len(t.encode()) for t in texts) / math.log(2)
        start += len(texts)
    lm_bpb["macro"] = sum(lm_bpb[d] for d in domains) / len(domains)
    ray_bpb = {**{d: results["domains"][d]["bits_per_byte"] for d in domains},
               "macro": results["macro"]["bits_per_byte"]}
    sweep_bpb = {**{d: swept["domains"][d]["bits_per_byte"] for d in domains}, "macro": swept["macro"]["bits_per_byte"]}

    print(f"GPT-2 124M shape (random init), {args.device}; " + ", ".join(
        f"{name}: {len(texts)} docs, {results['domains'][name]['tokens']} tokens" for name, texts in domains.items()))
    print(f"{'run':<62} {'wall s':>8} {'tokens/s':>10}")
    for name, wall in (("raylm ppl --domain-column (whole command, checkpointing)", ray_wall),
                       ("raylm sweep, the corpus on its resident actor (whole command)", sweep_wall),
                       (f"lm-eval HFLM loglikelihood_rolling batch {args.batch_size} (whole process)", lm_wall),
                       (f"bare forward, batch {args.batch_size} (after loading)", bare_wall)):
        print(f"{name:<62} {wall:>8.1f} {tokens / wall:>10.0f}")
    for name, wall in (("raylm ppl", ray_wall), ("raylm sweep", sweep_wall)):
        print(f"{name} vs lm-eval speed: {lm_wall / wall:.2f}x; {name} tokens/s vs bare forward: "
              f"{bare_wall / wall:.2f}")
    for name, bpb in (("raylm ppl", ray_bpb), ("raylm sweep", sweep_bpb)):
        print(f"bits per byte, {name} - lm-eval: " + ", ".join(f"{k} {bpb[k] - lm_bpb[k]:+.2e}" for k in bpb))
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
