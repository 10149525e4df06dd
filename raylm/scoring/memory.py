"""How much memory keys and values may take, measured from the device, and what a generation call holds in it.

The scorer and the generation engine share one token budget (raylm.scoring.batching.TokenBudget): the width of a
forward pass, halved on out-of-memory by the one halving loop, halving_on_oom, and grown back once passes fit
again. The keys and values a generation call keeps (the shared prefix, the slots, a prefill's rows) are bounded
by KV_SHARE of the device memory free once the weights are loaded, scaled down as the token budget is: an
out-of-memory error in scoring or generation cuts both. The rest of the free memory holds the forward passes'
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


def kv_bytes(device: torch.device) -> int:
    """Bytes generation's keys and values may take on `device`, measured now (once the weights are loaded): on a GPU,
    KV_SHARE of its free memory, counting what PyTorch's allocator holds cached but unused as free."""
    if device.type != "cuda":
        return CPU_KV_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return kv_share(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


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
