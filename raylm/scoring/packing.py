"""Model rows and the masks they need: one request per row, or a piece of a token tree (raylm.scoring.tree) whose
columns each see only their ancestors, so many requests sharing a prefix run it once.

A row's columns are laid out in trie preorder, so a column's descendants inside the row are the `spans[j]` columns
starting at j: column i sees column j iff j <= i < j + spans[j]. That one rule covers a plain request (a chain: each
column sees every earlier one), a document's endings after their shared context (the old two-level packing) and a
whole subject's questions below a shared few-shot head, at any depth. Position ids are the tokens' true positions
(their depth in the tree), so each request sees exactly what it would see alone; a row may also continue a cached
path (a prefix already run into a KV cache), whose columns are all its ancestors.

The masks a batch needs (raylm.scoring.attention decides their layout per model) are built here too: every row of a
batch that holds a tree row gets them, so a plain row next to a tree row keeps its sliding window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from raylm.scoring.attention import ONE_TENSOR, MaskLayout


@dataclass(frozen=True)
class PackedRow:
    """One model row. `spans[j]` counts column j and its descendants in this row (they follow it); `predicts` are
    (column, request, target index): that column's output predicts that continuation token of that request."""

    tokens: list[int]
    positions: list[int]
    spans: list[int]
    predicts: list[tuple[int, int, int]]

    @property
    def requests(self) -> list[int]:
        """The requests this row predicts tokens of, in order of first appearance."""
        return list(dict.fromkeys(request for _, request, _ in self.predicts))

    @property
    def branched(self) -> bool:
        """Whether the row is anything but one plain request from position 0 (the model's own mask would do)."""
        n = len(self.tokens)
        return self.positions[:1] != [0] or any(s != n - j for j, s in enumerate(self.spans))


def chain_row(tokens: Sequence[int], request: int, n_targets: int) -> PackedRow:
    """A request alone: input index t predicts continuation token t - (n - n_targets)."""
    n = len(tokens)
    return PackedRow(list(tokens), list(range(n)), [n - j for j in range(n)],
                     [(n - n_targets + t, request, t) for t in range(n_targets)])


def visibility(spans: torch.Tensor, positions: torch.Tensor, cached: int, window: int | None) -> torch.Tensor:
    """[rows, q, cached + q] bool: every cached column (an ancestor of the whole row), then the row's own
    ancestors-or-self; with a sliding window, only keys whose position is less than `window` behind the query's
    (q - k < window, as transformers' sliding_window_overlay has it), cached keys included."""
    width = spans.shape[1]
    col = torch.arange(width)
    own = (col[None, None, :] <= col[None, :, None]) & (col[None, :, None] < (col[None, :] + spans)[:, None, :])
    if window is not None:
        own &= (positions[:, :, None] - positions[:, None, :]) < window
    past = torch.ones(spans.shape[0], width, cached, dtype=torch.bool)
    if window is not None and cached:
        past &= (positions[:, :, None] - torch.arange(cached)[None, None, :]) < window
    return torch.cat([past, own], dim=-1)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 1, q, k]: 0 where visible, the dtype's minimum elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def branch_inputs(batch: Sequence[PackedRow], width: int, layout: MaskLayout, dtype: torch.dtype, cached: int = 0
                  ) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
    """True positions and the masks `layout` asks for (one 4D tensor, or a dict of them keyed by layer type), over
    `cached` columns of a KV cache and then the batch's own. Right padding sees only itself."""
    positions = torch.zeros(len(batch), width, dtype=torch.long)
    spans = torch.ones(len(batch), width, dtype=torch.long)
    for r, row in enumerate(batch):
        positions[r, :len(row.tokens)] = torch.tensor(row.positions)
        spans[r, :len(row.tokens)] = torch.tensor(row.spans)
    masks = {key: additive_mask(visibility(spans, positions, cached, window), dtype) for key, window in layout}
    return {"position_ids": positions, "attention_mask": masks.get(ONE_TENSOR, masks)}
