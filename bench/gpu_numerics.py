"""The numerics half of the one GPU check (bench/gpu.sh), on random weights of real shapes:

- `hellaswag`: an 8B-shaped Llama in bfloat16, raylm's Scorer against lm-eval's HFLM on the same GPU, the same model
  object and the same HellaSwag requests (every row in --data: the full validation set is 10,042 documents, the
  offline copy 1,000, the packaged demo 300; the script says which it had). Per request |Δ loglikelihood|, differing
  predictions and whether lm-eval's own numbers tie there; raylm packed against unpacked (bfloat16 noise bound:
  2^-5 |LL| + 0.02 nats per token, tests/test_lowp_lmeval.py); wall times, docs/s and MFU.
- `max-length`: peak GPU memory above the weights for scoring one long document in rolling windows of several
  --max-length values, on an 8B-shaped model whose config states 131,072 positions and a 128,256-id vocabulary.
- `load`: a checkpoint saved to disk loaded by raylm's own load_model straight onto the GPU (peak host memory
  against the checkpoint's size), and, on a machine with two GPUs, over both (raylm's device-map plan) with the
  same scores as on one.

The GPU machine's image has torch, transformers and accelerate but neither Ray nor datasets; lm-eval only when carried
as a wheel (bench/gpu_carry.sh). Without it the lm-eval columns say so and the rest runs. At a tiny size on CPU
(tests/test_bench_gpu_driver.py) every check runs end to end; there the two-device case spreads the model over the
CPU and a disk offload folder instead, through the same code.

    python bench/gpu_numerics.py hellaswag --data .gpu-data
    python bench/gpu_numerics.py max-length
    python bench/gpu_numerics.py load
    python bench/gpu_numerics.py all --tiny --device cpu --docs 12            # smoke test: every check
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bf16_vs_lmeval import COLUMNS, compare  # noqa: E402
from gpu_driver import H200_BF16_FLOPS, body_and_head_params, config  # noqa: E402
from raylm.data.demo import DEMO_DATA, DEMO_MODEL  # noqa: E402
from raylm.models.devices import Budget  # noqa: E402
from raylm.models.loading import load_model, load_tokenizer  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402
from raylm.requests.encoding import Encoder  # noqa: E402
from raylm.requests.table import build_requests  # noqa: E402
from raylm.requests.windows import strided_windows  # noqa: E402
from raylm.scoring.scorer import Scorer  # noqa: E402
from raylm.tasks import get_task  # noqa: E402

HELLASWAG_FULL = 10_042
NOISE_RTOL, NOISE_ATOL_PER_TOKEN = 2.0**-5, 2e-2  # bfloat16, as tests/test_lowp_lmeval.py justifies
GIB = 2**30


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_model(shape: str, device: str, dtype: torch.dtype, **overrides) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    cfg = config(shape)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def hellaswag_requests(data: Path, docs: int | None, tokenizer, max_length: int):
    task = get_task("hellaswag")
    rows = task.load_docs(data)
    chosen = rows[:docs] if docs else rows
    print(f"HellaSwag: {len(chosen)} documents ({len(rows)} rows in {data}; the full validation set has "
          f"{HELLASWAG_FULL:,})", flush=True)
    return chosen, build_requests(task, chosen, Encoder(tokenizer, max_length))


def per_doc(values: np.ndarray, doc_ids: list[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for doc, value in zip(doc_ids, values.tolist()):
        out.setdefault(doc, []).append(value)
    return out


def lmeval_loglikelihoods(model, tokenizer, docs, max_length: int, batch_size: int) -> tuple[np.ndarray, float] | str:
    """lm-eval's HFLM on the very model object raylm scored, or why it could not run."""
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM
    except ImportError as e:
        return f"lm-eval not importable here ({e}); carry its wheel (bench/gpu_carry.sh)"
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    requests = [Instance("loglikelihood", {}, (c, k), i)
                for i, (c, k) in enumerate((c, k) for d in docs for c, k in zip(d.contexts, d.continuations))]
    device = str(next(model.parameters()).device)
    sync(device)
    start = time.perf_counter()
    out = lm.loglikelihood(requests, disable_tqdm=True)
    sync(device)
    return np.array([ll for ll, _ in out]), time.perf_counter() - start


def check_hellaswag(args) -> None:
    shape = "tiny" if args.tiny else "llama-8b"
    max_length = 512 if args.tiny else 2048
    model = random_model(shape, args.device, getattr(torch, args.dtype))
    tokenizer = load_tokenizer(ModelSpec(str(args.tokenizer)))
    docs, table = hellaswag_requests(args.data, args.docs, tokenizer, max_length)
    contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
    doc_ids = table["doc_id"].to_pylist()
    tokens = np.array([len(k) for k in continuations])

    def timed(scorer: Scorer) -> tuple[np.ndarray, float]:
        scorer.score(contexts[:64], continuations[:64])  # warm-up, and the first OOM probe
        sync(args.device)
        start = time.perf_counter()
        loglik, _ = scorer.score(contexts, continuations)
        sync(args.device)
        return loglik, time.perf_counter() - start

    packed_scorer = Scorer(model, max_length)
    packed, packed_s = timed(packed_scorer)
    alone, alone_s = timed(Scorer(model, max_length, share_prefixes=False))
    body, head = body_and_head_params(model)
    flops = 2.0 * body * sum(len(c) + len(k) for c, k in zip(contexts, continuations)) + 2.0 * head * tokens.sum()
    print(f"\n## {shape} {args.dtype} on {args.device}: raylm packed vs unpacked, {len(contexts)} requests\n")
    print("| scoring | wall s | docs/s | TFLOP/s, every request's tokens counted | MFU (790) | final budget |")
    print("|---|---|---|---|---|---|")
    for label, wall in (("packed", packed_s), ("unpacked", alone_s)):
        print(f"| {label} | {wall:.2f} | {len(docs) / wall:.0f} | {flops / wall / 1e12:.1f} | "
              f"{100 * flops / wall / H200_BF16_FLOPS:.1f}% | {packed_scorer.token_budget} |")
    diff = np.abs(packed - alone)
    bound = NOISE_RTOL * np.abs(alone) + NOISE_ATOL_PER_TOKEN * tokens
    print(f"\npacked vs unpacked: max |Δ| {diff.max():.3g} nats, max |Δ|/|LL| {(diff / np.abs(alone)).max():.2%}, "
          f"{(diff / bound).max():.2f} of the bfloat16 noise bound ({'within' if np.all(diff <= bound) else 'OVER'})")

    theirs = lmeval_loglikelihoods(model, tokenizer, docs, max_length, args.lmeval_batch_size)
    if isinstance(theirs, str):
        print(f"lm-eval: {theirs}")
        return
    lmeval, lmeval_s = theirs
    row = compare(per_doc(packed, doc_ids), per_doc(lmeval, doc_ids), None, args.dtype)
    print(f"\n## raylm vs lm-eval {args.dtype} HFLM on the same model: lm-eval {lmeval_s:.1f} s, raylm "
          f"{packed_s:.1f} s ({lmeval_s / packed_s:.2f}x)\n")
    print("| " + " | ".join(COLUMNS[:7]) + " |")
    print("|" + "---|" * 7)
    print("| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in row[:7]) + " |")


def check_max_length(args) -> None:
    shape = "tiny" if args.tiny else "llama-8b"
    positions = 2048 if args.tiny else 131_072
    model = random_model(shape, args.device, getattr(torch, args.dtype), max_position_embeddings=positions)
    length = args.doc_tokens or (1536 if args.tiny else 32_768)
    lengths = [int(n) for n in args.max_lengths.split(",")] if args.max_lengths else \
        ([128, 512, 1536] if args.tiny else [2048, 8192, 32_768])
    doc = torch.randint(3, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    weights = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0
    print(f"\n## {shape} {args.dtype}: one {length:,}-token document in rolling windows, vocabulary "
          f"{model.config.vocab_size:,}, stated context {positions:,}\n")
    print("| --max-length | windows | wall s | peak GPU memory above the weights |")
    print("|---|---|---|---|")
    for max_length in lengths:
        windows = strided_windows(doc, 1, max_length, max_length)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            Scorer(model, max_length).score([w[0] for w in windows], [w[1] for w in windows])
            sync(args.device)
            peak = (f"{(torch.cuda.max_memory_allocated() - weights) / GIB:.2f} GiB"
                    if args.device.startswith("cuda") else "n/a (CPU)")
        except torch.cuda.OutOfMemoryError:
            peak = "out of memory"
        print(f"| {max_length:,} | {len(windows)} | {time.perf_counter() - start:.2f} | {peak} |", flush=True)


class PeakRss:
    """This process's peak resident memory while the block runs, sampled every 10 ms."""

    def __enter__(self):
        import psutil

        self._process, self._stop = psutil.Process(), threading.Event()
        self.start = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def check_load(args) -> None:
    shape = "tiny" if args.tiny else "llama-1b"
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="raylm-gpu-load-") as tmp:
        path = Path(tmp) / shape
        model = random_model(shape, args.device, dtype)
        model.save_pretrained(path)
        load_tokenizer(ModelSpec(str(args.tokenizer))).save_pretrained(path)
        checkpoint = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        del model
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        spec = ModelSpec(str(path), dtype=args.dtype, device=args.device)
        with PeakRss() as rss:
            model = load_model(spec)
        print(f"\n## load_model of a {checkpoint / GIB:.2f} GiB {shape} checkpoint onto {args.device}: host memory "
              f"grew by at most {(rss.peak - rss.start) / GIB:.2f} GiB while loading")
        tokenizer = load_tokenizer(spec)
        docs, table = hellaswag_requests(args.data, args.docs or 200, tokenizer, 512 if args.tiny else 2048)
        requests = (table["context"].to_pylist(), table["continuation"].to_pylist())
        one, one_s = _timed_score(model, requests, args.device)
        del model
        gc.collect()
        two_devices = args.device.startswith("cuda") and torch.cuda.device_count() >= 2
        if not two_devices and args.device.startswith("cuda"):
            print(f"one device ({torch.cuda.device_count()} visible): the two-GPU device map is not run here")
            return
        if two_devices:
            spread, where = load_model(spec, gpus=2), "GPUs 0 and 1"
        else:  # the CPU smoke run: the same dispatch hooks over the CPU and a disk offload folder
            budget = Budget({"cpu": int(checkpoint * 0.9), "disk": 4 * checkpoint}, offload_folder=f"{tmp}/offload")
            spread, where = load_model(spec, budget=budget), "the CPU and disk"
        placed = {}
        for module, device in spread.hf_device_map.items():
            placed.setdefault(str(device), []).append(module)
        two, two_s = _timed_score(spread, requests, args.device)
        tokens = np.array([len(k) for k in requests[1]])
        diff = np.abs(two - one)
        bound = NOISE_RTOL * np.abs(one) + NOISE_ATOL_PER_TOKEN * tokens
        print(f"spread over {where}: {', '.join(f'{d}: {len(m)} modules' for d, m in placed.items())}; "
              f"{len(docs)} docs in {two_s:.2f} s (one device: {one_s:.2f} s); max |Δ| vs one device "
              f"{diff.max():.3g} nats ({'within' if np.all(diff <= bound) else 'OVER'} the bfloat16 noise bound)")


def _timed_score(model, requests, device: str) -> tuple[np.ndarray, float]:
    scorer = Scorer(model, model.config.max_position_embeddings)
    sync(device)
    start = time.perf_counter()
    loglik, _ = scorer.score(*requests)
    sync(device)
    return loglik, time.perf_counter() - start


CHECKS = {"hellaswag": check_hellaswag, "load": check_load, "max-length": check_max_length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=[*CHECKS, "all"], help="one check, or all of them in one process")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--data", type=Path, default=DEMO_DATA, help="directory with hellaswag/validation.jsonl")
    parser.add_argument("--tokenizer", type=Path, default=DEMO_MODEL, help="tokenizer directory (default: the "
                        "packaged stories260K one, whose ids fit any vocabulary)")
    parser.add_argument("--docs", type=int, help="first N HellaSwag documents (default: all in --data; load: 200)")
    parser.add_argument("--lmeval-batch-size", type=int, default=64)
    parser.add_argument("--doc-tokens", type=int, help="max-length: tokens in the long document")
    parser.add_argument("--max-lengths", help="max-length: comma-separated --max-length values")
    parser.add_argument("--tiny", action="store_true", help="tiny Llama shape, for a CPU smoke test")
    args = parser.parse_args()
    for name in CHECKS if args.check == "all" else [args.check]:
        CHECKS[name](args)


if __name__ == "__main__":
    main()
