"""Where a scoring actor puts its model: the device the placement chose, checked where the actor runs.

A GPU actor that finds no CUDA device (a CPU build of torch, a driver that failed, a node whose GPUs Ray counts but
this process cannot see) stops with one line rather than score on CPU unnoticed. Drills on Ray's fake autoscaler
(whose GPUs are only numbers) set RAYLM_FAKE_GPUS=1 in the job's environment: an actor Ray gave a GPU to, and that
finds no CUDA device, then computes on CPU and says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import ray

from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec

log = logging.getLogger(__name__)

FAKE_GPUS_ENV = "RAYLM_FAKE_GPUS"


def device_here(spec: ModelSpec) -> ModelSpec:
    """The spec with the device this process loads the model onto: the placement's, or CPU under the drill."""
    if not spec.device.startswith("cuda"):
        return spec
    import torch

    if torch.cuda.is_available():
        return spec
    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    if gpus and fake_gpus():
        log.warning("%s=1: computing on CPU although Ray gave this actor GPU(s) %s", FAKE_GPUS_ENV, gpus)
        return replace(spec, device="cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise RaylmError(f"a GPU scoring actor (Ray's GPU ids: {gpus or 'none'}, CUDA_VISIBLE_DEVICES="
                     f"{visible if visible is not None else 'unset'}) finds no CUDA device: torch {torch.__version__} "
                     f"{'has no CUDA support' if torch.version.cuda is None else 'sees no GPU'} on this node")


def fake_gpus() -> bool:
    text = os.environ.get(FAKE_GPUS_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise RaylmError(f"{FAKE_GPUS_ENV} must be 1 (or 0, or unset), got {text!r}")
    return text == "1"


def assigned_gpus(spec: ModelSpec) -> int:
    """How many GPUs the model of `spec` (as device_here placed it) may be spread over in this process: the whole
    GPUs Ray assigned this actor (it sets CUDA_VISIBLE_DEVICES to exactly those, so they are devices 0..n-1 here).
    1 for a spec on CPU (the fake-GPU drill included), a fractional share, or code outside an actor (tests)."""
    if spec.device == "cpu" or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return 1
    return max(1, len(ray.get_gpu_ids()))
