"""Where a model's weights go: straight onto one device, or spread over an actor's GPUs by a device map.

One device: from_pretrained is given `device_map={"": device}` and reads every weight from the checkpoint onto
that device, never into host memory first, so N actors on a node need N models' worth of GPU memory but not of host
RAM (a `.to(device)` after loading held each actor's whole model in host memory on the way).

Several GPUs (`--num-gpus G`, G > 1, for one actor): the model's layers are spread over the actor's G GPUs by a
device map planned here, from the config on the meta device (no weight read, no memory taken), with transformers'
own balanced planner and a budget per device. from_pretrained then loads each layer onto its GPU and installs
accelerate's hooks, which move activations from one GPU to the next at run time: pipeline parallel inside the
actor (one GPU busy at a time, as lm-eval's parallelize=True), data parallel across actors and nodes. A model that
does not fit its budget fails at planning, before any weight is read, rather than spilling onto the CPU.

The same hooks carry a model whose modules sit on the CPU and on disk (an offload folder), which is how
tests/test_device_map.py proves scoring through a dispatched model on a machine without GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raylm.errors import RaylmError

if TYPE_CHECKING:
    import torch

# Of each GPU's free memory, the share a spread model's weights may take; the rest holds activations, the gathered
# logits and the CUDA context. The scorer halves its token budget on out-of-memory, so this only needs to leave room
# for its smallest batches.
WEIGHTS_FRACTION = 0.85
GIB = 2**30


@dataclass(frozen=True)
class Budget:
    """Bytes of weights each device may hold: GPU indices (as the actor sees them), "cpu", "disk". "disk" needs an
    offload folder to write the offloaded weights to."""

    max_memory: dict[int | str, int]
    offload_folder: str | None = None

    def describe(self) -> str:
        return ", ".join(f"{'GPU ' if isinstance(d, int) else ''}{d}: {b / GIB:.1f} GiB"
                         for d, b in self.max_memory.items())


def gpu_budget(gpus: int, fraction: float = WEIGHTS_FRACTION) -> Budget:
    """`fraction` of the free memory of each of the first `gpus` CUDA devices this process sees (under Ray, exactly
    the actor's GPUs: Ray sets CUDA_VISIBLE_DEVICES to them)."""
    import torch

    visible = torch.cuda.device_count()
    if visible < gpus:
        raise RaylmError(f"asked to spread the model over {gpus} GPUs, but this process sees {visible} CUDA "
                         "device(s)")
    return Budget({i: int(torch.cuda.mem_get_info(i)[0] * fraction) for i in range(gpus)})


def meta_model(config, auto_class: str, dtype: torch.dtype | None = None, trust_remote_code: bool = False
               ) -> torch.nn.Module:
    """The model built from its config on the meta device: every tensor a shape without storage (accelerate's
    init_empty_weights allocates each parameter on the CPU first: seconds and gigabytes for an 8B model's
    embedding)."""
    import torch
    import transformers

    with torch.device("meta"):
        return getattr(transformers, auto_class).from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)


def count_parameters(config, auto_class: str, trust_remote_code: bool = False) -> int:
    """The model's parameters (tied ones once), from its config alone."""
    return sum(p.numel() for p in meta_model(config, auto_class, None, trust_remote_code).parameters())


def plan_device_map(config, dtype: torch.dtype, budget: Budget, auto_class: str = "AutoModelForCausalLM",
                    trust_remote_code: bool = False) -> dict[str, int | str]:
    """Module name -> device, balanced over the budget's devices, planned on the meta device from the config.

    Layers are never split (the class's own _no_split_modules), tied weights land together, and the plan must use
    only devices the budget names: accelerate's planner would put what does not fit on "disk", which is refused
    here unless the budget asks for it.
    """
    from transformers.integrations.accelerate import compute_module_sizes, get_balanced_memory, infer_auto_device_map

    model = meta_model(config, auto_class, dtype, trust_remote_code)
    no_split = model._no_split_modules or []
    balanced = get_balanced_memory(model, max_memory=dict(budget.max_memory), no_split_module_classes=no_split)
    plan = dict(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split))
    outside = sorted({str(d) for d in plan.values()} - {str(d) for d in budget.max_memory})
    if outside:
        sizes = compute_module_sizes(model)
        total = (sizes[0] if isinstance(sizes, tuple) else sizes)[""]
        raise RaylmError(f"the model's weights ({total / GIB:.1f} GiB in {str(dtype).removeprefix('torch.')}) do not "
                         f"fit the devices given ({budget.describe()}): planning put some on {', '.join(outside)}; "
                         "use more --num-gpus per actor, or --load-in-8bit/--load-in-4bit")
    return plan


def placement_kwargs(device: str, config, dtype: torch.dtype, gpus: int, budget: Budget | None,
                     auto_class: str, trust_remote_code: bool) -> dict:
    """What from_pretrained is given so that weights go straight to where they run: a planned device map for a
    budget (or for more than one GPU), the one device for a GPU, nothing for the CPU (weights load there anyway)."""
    if budget is None and gpus > 1:
        if not device.startswith("cuda"):
            raise RaylmError(f"a model can be spread over several GPUs only on CUDA devices, not {device!r}")
        budget = gpu_budget(gpus)
    if budget is not None:
        plan = plan_device_map(config, dtype, budget, auto_class, trust_remote_code)
        return {"device_map": plan, **({"offload_folder": budget.offload_folder} if budget.offload_folder else {})}
    return {"device_map": {"": device}} if device != "cpu" else {}


def input_device(model: torch.nn.Module) -> torch.device:
    """Where the model's first layer runs, so token ids are made there: the input embedding's device, or, for a
    model dispatched by accelerate, its hook's execution device (an offloaded embedding's weight sits on `meta`)."""
    import torch

    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None:  # a wrapper that is no PreTrainedModel: its parameters are where it runs
        return next(model.parameters()).device
    device = getattr(getattr(embeddings, "_hf_hook", None), "execution_device", None)
    if device is None:
        return embeddings.weight.device
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
