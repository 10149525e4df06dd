"""How much memory keys and values may take, measured from the device, and what a generation call holds in it.

The scorer and the generation engine share one token budget (raylm.scoring.batching.TokenBudget): the width of a
forward pass, halved on out-of-memory by the one halving loop, halving_on_oom, and grown back once passes fit
again. The keys and values a generation call keeps (the shared prefix, the slots, a prefill's rows) are bounded
by KV_SHARE of the device memory free once the weights are loaded, scaled down as the token budget is: an
out-of-memory error in scoring or generation cuts both. An actor with a fraction of a GPU (--num-gpus 0.5) counts
as free no more than its fraction of the card less what it holds itself: the card's free memory is its
neighbours' too. The rest of the free memory holds the forward passes'
activations and logits (LOGITS_BUDGET_BYTES), which the token budget bounds.

What a call holds, in cached tokens (rows times columns), is `generation_tokens`: it is how the engine sizes its
slots, and how the table in docs/numerics.md is computed.
"""

from __future__ import annotations

import torch

from raylm.models.loading import text_config
from raylm.scoring.generation_cache import slot_columns

GIB = 2**30
# On the CPU, keys and values get a fixed share: host memory is shared with everything else on the machine.
CPU_KV_BYTES = 2 * GIB
# Of the GPU memory free after the weights are loaded, the share keys and values may take.
KV_SHARE = 0.5


def kv_bytes(device: torch.device, gpu_share: float = 1.0) -> int:
    """Bytes generation's keys and values may take on `device`, measured now (once the weights are loaded): on a GPU,
    KV_SHARE of the memory this process may still fill there (usable_bytes), `gpu_share` being the fraction of the
    GPU it was given (1 for a GPU of its own)."""
    if device.type != "cuda":
        return CPU_KV_BYTES
    free, total = torch.cuda.mem_get_info(device)
    return kv_share(usable_bytes(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device),
                                 gpu_share))


def usable_bytes(free: int, total: int, reserved: int, allocated: int, gpu_share: float = 1.0) -> int:
    """Bytes a process may still fill on a GPU of `total` bytes that reports `free`, PyTorch's allocator holding
    `reserved` of which `allocated` is in use (the rest is free to this process, not to others). With a fraction
    of the GPU (actors packed on one card by --num-gpus 0.5), no more than that fraction of the card less what the
    process has allocated: every actor on the card sees the same free memory, and each budgeting from all of it
    would count its neighbours' share as its own, whichever of them loaded first. Never more than the card has
    free either, whatever holds the rest."""
    usable = free + reserved - allocated
    if gpu_share < 1:
        usable = min(usable, int(total * gpu_share) - allocated)
    return max(0, usable)


def kv_share(free: int) -> int:
    """The KV budget out of `free` bytes: what the device measures, or docs/numerics.md's table assumes."""
    return int(free * KV_SHARE)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Keys and values one token keeps in the cache, over all layers."""
    config = text_config(config)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * (torch.finfo(dtype).bits // 8)


def generation_tokens(slots: int, prefix: int, longest: int, prefill: int) -> int:
    """The most cached tokens a generation call holds at once with `slots` slots: the prefix on the path, once
    (`prefix` columns); each slot's buffers for sequences of at most `longest` columns; and the keys of a prefill
    of as many rows, `prefill` columns each (the suffix after a prefix held once, else the whole context, the
    prefix copied into the row)."""
    return prefix + slots * (slot_columns(longest) + prefill)


def slots_fitting(budget: int, prefix: int, longest: int, prefill: int) -> int:
    """The most slots whose generation_tokens stay within `budget` cached tokens (0 if not even one's do)."""
    return max(0, (budget - prefix) // (slot_columns(longest) + prefill))
