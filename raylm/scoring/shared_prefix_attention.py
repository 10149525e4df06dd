"""Attention to a prompt prefix that every sequence of a batch shares, read once for all of them (cascade attention).

When every request of a generation call starts with the same tokens (gsm8k_cot's eight exemplars, a long system
prompt), the engine keeps that prefix's keys and values once, batch 1, and the slots only what follows it. At each
decoding step every query attends to the prefix's keys (one matrix product over all rows and heads, the prefix read
once) and to its own row's keys under the model's own mask, with one softmax over both: the same weights as
attention over the prefix copied into every row, without the copies. With a copy per row, forty sequences over
gsm8k_cot's 1,100-token prompt hold gigabytes of keys that are written once and read at every step; on CPU that
memory, and reading it, was most of decoding.

The function is registered with transformers' AttentionInterface under NAME and used only while the engine has a
model switched to it (`prefix_attention`, around a decoding step); the mask is the eager one (an additive float
mask, always built), so what the model's mask code decides (padding, causality) applies to the rows' own keys as in
eager attention. Models that do not route attention through that interface, or whose attention adds anything the
function does not do (sliding windows, logit soft-capping, GPT-2's reordered upcast), keep the slots' copies
(`takes_shared_prefix`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from raylm.models.loading import text_config

NAME = "raylm_shared_prefix"
# The shared prefix's cache while a forward pass runs (attending_to).
_PREFIX: ContextVar[DynamicCache | None] = ContextVar(NAME, default=None)
# Config fields that change attention in a way the function does not reproduce, where set.
_UNSUPPORTED = ("sliding_window", "attn_logit_softcapping", "reorder_and_upcast_attn")


def shared_prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """Eager attention over [shared prefix keys, the row's own keys]: query (rows, heads, q, dim), key and value
    (rows, kv heads, k, dim), the prefix's (1, kv heads, p, dim); returns (rows, q, heads, dim) as transformers'
    attention functions do."""
    prefix = _PREFIX.get()
    if prefix is None:
        raise RuntimeError(f"{NAME} ran outside attending_to(prefix): it has no shared prefix to attend to")
    if kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        raise ValueError(f"{NAME} does not apply attention sinks or soft-capping; the engine must not use it here")
    rows, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scaling = dim ** -0.5 if scaling is None else scaling
    layer = prefix.layers[module.layer_idx]
    p = layer.keys.shape[-2]
    grouped = query.reshape(rows, kv_heads, groups * q, dim)
    own = torch.matmul(grouped, key.transpose(-1, -2)).mul_(scaling)  # (rows, kv heads, groups * q, k)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :key.shape[-2]]  # (rows or 1, 1, q, k), as eager slices it
        own = own.view(rows, kv_heads, groups, q, -1).add_(mask[:, :, None]).view(rows, kv_heads, groups * q, -1)
    # (kv heads, rows * groups * q, dim) @ (kv heads, dim, p): the prefix's keys read once for every row
    by_head = grouped.transpose(0, 1).reshape(kv_heads, rows * groups * q, dim)
    on_prefix = torch.matmul(by_head, layer.keys[0].transpose(-1, -2)).mul_(scaling)
    scores = torch.cat([on_prefix.view(kv_heads, rows, groups * q, p).transpose(0, 1), own], dim=-1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(weights[..., p:], value)  # (rows, kv heads, groups * q, dim)
    to_prefix = weights[..., :p].transpose(0, 1).reshape(kv_heads, rows * groups * q, p)
    out += torch.matmul(to_prefix, layer.values[0]).view(kv_heads, rows, groups * q, dim).transpose(0, 1)
    return out.view(rows, heads, q, dim).transpose(1, 2), None


AttentionInterface.register(NAME, shared_prefix_attention)
AttentionMaskInterface.register(NAME, eager_mask)


def takes_shared_prefix(model: torch.nn.Module) -> bool:
    """Whether the model's attention can be switched to shared_prefix_attention without changing what it computes:
    it routes attention through transformers' interface and its config adds nothing the function leaves out."""
    if not getattr(model, "_supports_attention_backend", False) or not model._can_set_attn_implementation():
        return False
    config = text_config(model.config)
    if any(getattr(config, name, None) for name in _UNSUPPORTED):
        return False
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())


@contextmanager
def prefix_attention(model: torch.nn.Module) -> Iterator[None]:
    """The model's attention switched to shared_prefix_attention for the block, and back after it."""
    before = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


@contextmanager
def attending_to(prefix: DynamicCache) -> Iterator[None]:
    """Forward passes in the block attend to `prefix` (batch 1) before each row's own keys."""
    token = _PREFIX.set(prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)
