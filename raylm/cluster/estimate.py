"""The one work estimate: FLOPs from tokens and parameters, and the rates that turn them into time. Placement sizes
its actors with it (raylm.cluster.placement.Work) and a dry run's plan (raylm.evaluate.dry_run) reports it, so the
two cannot disagree.

A forward pass costs about 2 FLOPs per parameter per token (one multiply and one add per weight; attention's share
is small at the context lengths scored here). Where each figure comes from is in docs/dry-run.md:

- PLACEMENT_GPU_ACTOR_FLOPS and PLACEMENT_CPU_THREAD_FLOPS: what placement assumes an actor gets through, on the low
  side on purpose, so a run is not split across more actors (each loading the model, each node billed) than it
  needs. They are rates over a request's every token (Work.tokens, before prefix sharing).
- CPU_THREAD_FLOPS_MEASURED: measured on this project's 2-core EPYC development machine over the tokens the token
  tree computes (bench/RESULTS.md, all 57 MMLU subjects x 20, 5-shot, GPT-2 small: 155 GFLOP/s on 2 threads).
- CPU_RUN_START_S: what a run on this machine's CPU costs besides scoring (the interpreter, a local Ray, an actor's
  start and a small model's load), measured there as raylm's whole command on one document (bench/RESULTS.md,
  bench/vs_loop.py --fixed-cost: 7.5 s and 8.7 s). A GPU cluster's start-up (nodes added, a large model's load) is
  not known here and not estimated.
- STREAM_START_S: what `raylm ppl` and `raylm kl` add to it, Ray Data's streaming pipeline (its executor, read
  tasks and actor pool) started and stopped: measured on that machine, while shared, as 20 s of whole command
  besides 3.6 s of estimated scoring (bench/plan_estimate.py --quick's 50-line corpus), 12 s over an eval's start.
- GPU_TYPES: each card's published dense bf16 tensor peak and memory, times ASSUMED_GPU_UTILISATION. No GPU figure
  here is measured yet: they are assumptions until a benchmark on each card replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOPS_PER_PARAMETER_TOKEN = 2.0
PLACEMENT_GPU_ACTOR_FLOPS = 40e12
PLACEMENT_CPU_THREAD_FLOPS = 20e9
CPU_THREAD_FLOPS_MEASURED = 77.5e9
CPU_RUN_START_S = 8.0
STREAM_START_S = 12.0
# Scoring is batched prefill, compute-bound: a third of the dense peak is an assumption, not a measurement.
ASSUMED_GPU_UTILISATION = 1 / 3


@dataclass(frozen=True)
class GpuType:
    """A GPU a plan is priced on: its memory and its published dense bf16 tensor peak (no sparsity)."""

    name: str
    memory_gib: float
    peak_bf16_flops: float
    source: str

    @property
    def flops(self) -> float:
        """The rate a plan assumes one actor on one such GPU gets through."""
        return self.peak_bf16_flops * ASSUMED_GPU_UTILISATION


GPU_TYPES = (
    GpuType("A10G", 24, 70e12, "AWS G5 / NVIDIA A10G: 70 TFLOP/s bf16 tensor, dense (assumed)"),
    GpuType("L4", 24, 121e12, "NVIDIA L4 datasheet: 121 TFLOP/s bf16 tensor, dense (242 with sparsity)"),
    GpuType("A100", 80, 312e12, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 tensor, dense (624 with sparsity)"),
    GpuType("H100", 80, 989e12, "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 tensor, dense (1,979 with sparsity)"),
    GpuType("H200", 141, 989e12, "NVIDIA H200 SXM datasheet: 989 TFLOP/s bf16 tensor, dense; 141 GB"),
)


def forward_flops(tokens: int, parameters: int) -> float:
    """FLOPs of running `tokens` tokens through a model of `parameters` parameters."""
    return tokens * FLOPS_PER_PARAMETER_TOKEN * parameters


def placement_flops(device: str, threads: int = 1) -> float:
    """What placement assumes one actor on `device` ("cuda", or "cpu" with `threads` torch threads) gets through."""
    return PLACEMENT_GPU_ACTOR_FLOPS if device == "cuda" else PLACEMENT_CPU_THREAD_FLOPS * threads


def seconds(tokens: int, parameters: int, flops: float) -> float:
    """The estimated seconds one actor at `flops` takes for `tokens` tokens of a model of `parameters`."""
    return forward_flops(tokens, parameters) / flops
