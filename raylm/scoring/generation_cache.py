"""The two KV caches of the generation engine: the shared-prefix path, and the slots being decoded.

Both are transformers DynamicCaches built without a config, so every layer keeps every key (a sliding window is the
model's mask to apply, from its own 2D-mask code, as in HF generate) and crop works.

The path (batch 1) holds the prompt prefix the requests being admitted share: requests are admitted in sorted
order, so requests that share a few-shot head come one after another, and the path changes only where the shared
prefix does; like the scorer's tree walk, it is cropped back to what the next requests share and extended from
there, so each distinct shared prefix runs through the model once per generate() call.

The slots (batch = active sequences) hold each sequence's keys right-aligned: a row's valid keys are the last
`length` columns, the columns before them stale or padding. That is HF generate's left padding, grown as sequences
join: a 2D mask and true position ids make each row see exactly its own tokens at their own positions, and sliding
windows (counted in columns by the model's mask code) stay exact because a row's columns are contiguous. A row that
joins longer than the cache widens it on the left; columns no row uses any more are cut off the left, so the width
is the longest live sequence. Its layers keep their keys and values in buffers with room to grow (_GrowingLayer):
DynamicLayer appends by concatenation, copying the whole cache for every new token, which for sixteen sequences
over an eight-shot GSM8K prompt was half of all decoding time on CPU; a decode step now writes its one column in
place, and the cache is copied only when a sequence joins or leaves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from raylm.requests.order import common_prefix_length
from raylm.scoring.scorer import crop_cache, forward, gather_head_inputs


# The slots' cache is at most this much wider than its longest live sequence, over 1 (see Slots.trim).
TRIM_FRACTION = 8


class PrefixPath:
    """The shared prefix currently cached, batch 1."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.cache: DynamicCache | None = None

    def shared_with(self, context: Sequence[int]) -> int:
        return common_prefix_length(self.tokens, context)

    def set(self, model: torch.nn.Module, device: torch.device, prefix: Sequence[int], piece: int) -> int:
        """Make the path `prefix`, keeping what it already shares with it and running the rest in forward passes of
        at most `piece` tokens (a long few-shot head is no wider a pass than the token budget); returns the tokens
        run."""
        keep = self.shared_with(prefix)
        del self.tokens[keep:]
        if self.cache is not None:
            crop_cache(self.cache, keep)
        extra = list(prefix[keep:])
        if extra and self.cache is None:
            self.cache = DynamicCache()
        # No position of the path predicts anything (each request prefills at least its own last token), so its
        # passes feed the LM head none of them: over the whole pass they would be logits of gigabytes for a long
        # few-shot head and a large vocabulary, computed to be dropped.
        head, nothing = model.get_output_embeddings(), torch.empty(0, dtype=torch.long, device=device)
        for start in range(0, len(extra), max(1, piece)):
            chunk = extra[start:start + max(1, piece)]
            with gather_head_inputs(head, nothing, 1, len(chunk)):
                forward(model, torch.tensor([chunk], device=device), self.cache)
            self.tokens.extend(chunk)
        return len(extra)

    def for_rows(self, rows: int) -> DynamicCache:
        """A cache holding the path for `rows` rows, for a prefill over it: the path's own tensors, broadcast, which
        the prefill's cat copies, so the path itself is not extended."""
        if not self.tokens:
            return DynamicCache()
        return DynamicCache(ddp_cache_data=[(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
                                            for layer in self.cache.layers])


class Slots:
    """The decoding sequences' keys and values, right-aligned in one cache; row r's valid keys start at starts[r]."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.starts: list[int] = []

    @property
    def width(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def __len__(self) -> int:
        return len(self.starts)

    def reserve(self, like: DynamicCache, rows: int, width: int) -> None:
        """Start with `rows` empty rows `width` columns wide (keys shaped as `like`'s), which the first admission's
        prefills then fill in place: appending each prefill's rows would copy the whole cache once per prefill."""
        self.cache = DynamicCache()
        self.cache.layer_class_to_replicate = _GrowingLayer
        for layer in like.layers:
            self.cache.layers.append(_GrowingLayer.reserved(layer.keys, layer.values, rows, width))
        self.starts = [width] * rows

    def add(self, prefilled: DynamicCache, rows: Sequence[int], lengths: Sequence[int], free: Sequence[int] = ()
            ) -> list[int]:
        """Move rows `rows` of a prefill cache (right-padded: row j's keys are its first lengths[j] columns) into the
        slots; returns the slot row each landed in. A row goes into a free slot row (one whose sequence stopped) in
        place, its keys written right-aligned over the stopped sequence's, which copies nothing else unless it is
        longer than the cache is wide (then every row is padded on the left first); rows beyond the free ones are
        appended, which copies the cache."""
        placed: list[int | None] = []
        free = list(free)
        appended: list[tuple[int, int]] = []
        for r, n in zip(rows, lengths):
            if free and self.cache is not None:
                if n > self.width:
                    self._widen(n)
                row, width = free.pop(0), self.width
                for new, layer in zip(prefilled.layers, self.cache.layers):
                    layer.keys[row, :, width - n:] = new.keys[r, :, :n]
                    layer.values[row, :, width - n:] = new.values[r, :, :n]
                self.starts[row] = width - n
                placed.append(row)
            else:
                placed.append(None)
                appended.append((r, n))
        if appended:
            first = len(self.starts)
            self._append(prefilled, [r for r, _ in appended], [n for _, n in appended])
            rows_after = iter(range(first, len(self.starts)))
            placed = [row if row is not None else next(rows_after) for row in placed]
        return placed  # type: ignore[return-value]

    def _widen(self, width: int) -> None:
        """Pad every row on the left to `width` columns (a copy), for a row that joins longer than the cache."""
        grow = width - self.width
        for layer in self.cache.layers:
            layer.replace(_pad_left(layer.keys, width), _pad_left(layer.values, width))
        self.starts = [start + grow for start in self.starts]

    def _append(self, prefilled: DynamicCache, rows: Sequence[int], lengths: Sequence[int]) -> None:
        """Join the rows after the slots' own, a layer at a time: each layer's old keys and values are let go as its
        joined ones are made, so the cache and its copy are never whole at once."""
        width = max(self.width, *lengths)
        grow = width - self.width
        if self.cache is None:
            self.cache = DynamicCache()
            self.cache.layer_class_to_replicate = _GrowingLayer
        for l, new in enumerate(prefilled.layers):
            old = self.cache.layers[l] if l < len(self.cache.layers) else None
            keys = _join(None if old is None else old.keys, new.keys, rows, lengths, width)
            values = _join(None if old is None else old.values, new.values, rows, lengths, width)
            if old is None:
                self.cache.update(keys, values, l)
            else:
                old.replace(keys, values)
        self.starts = [start + grow for start in self.starts] + [width - n for n in lengths]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (ascending), then cut the columns no kept row uses off the left: a copy of the cache, so
        the engine compacts only when stopped rows would otherwise cost more (see _Run.step)."""
        if len(rows) == len(self.starts):
            return
        if not rows:
            self.cache, self.starts = None, []
            return
        index = torch.tensor(list(rows), device=self.cache.layers[0].keys.device)
        self.cache.batch_select_indices(index)
        self.starts = [self.starts[r] for r in rows]
        cut = min(self.starts)
        if cut:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
            self.starts = [start - cut for start in self.starts]

    def trim(self, live: Sequence[int]) -> None:
        """Cut the columns no live row uses off the left once they are an eighth of the width or more (a cut copies
        the cache at the next step, so it is amortised): rows refilled in place keep the width growing by a column a
        step otherwise. A stopped row's keys there go with them; its start only has to stay a column index."""
        if not live:
            return
        cut = min(self.starts[r] for r in live)
        if cut and cut >= self.width // TRIM_FRACTION:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
            self.starts = [max(0, start - cut) for start in self.starts]

    def step_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The 2D attention mask over the cache plus one new column, and each row's next position."""
        width = self.width
        starts = torch.tensor(self.starts)
        mask = (torch.arange(width + 1)[None, :] >= starts[:, None]).long()
        positions = (width - starts)[:, None]
        return mask.to(device), positions.to(device)


def _join(old: torch.Tensor | None, new: torch.Tensor, rows: Sequence[int], lengths: Sequence[int], width: int
          ) -> torch.Tensor:
    """`old` rows left-padded to `width`, then `new`'s rows `rows` (row rows[j] valid in its first lengths[j]
    columns) right-aligned: written into one tensor, where padding, selecting and concatenating would each make
    copies beside it."""
    kept = 0 if old is None else old.shape[0]
    joined = new.new_zeros(kept + len(rows), new.shape[1], width, new.shape[3])
    if old is not None:
        joined[:kept, :, width - old.shape[2]:] = old
    for j, (r, n) in enumerate(zip(rows, lengths)):
        joined[kept + j, :, width - n:] = new[r, :, :n]
    return joined


def _pad_left(states: torch.Tensor, width: int) -> torch.Tensor:
    """Keys or values (rows, heads, columns, dim) padded with zero columns on the left to `width` columns."""
    if states.shape[2] >= width:
        return states
    padded = states.new_zeros(*states.shape[:2], width, states.shape[3])
    padded[:, :, width - states.shape[2]:] = states
    return padded


class _GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of the first columns of buffers with spare columns, so an
    update writes in place. Anything that replaces keys or values (a crop keeps them views; selecting rows, cutting
    columns off the left or joining rows does not) is noticed at the next update, which then buffers afresh.

    Whatever replaces them lets the buffers go at once (replace, batch_select_indices): held until the next update,
    every layer's old buffers would stay beside its new keys, the whole cache twice over."""

    def __init__(self) -> None:
        super().__init__()
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def reserved(cls, keys_like: torch.Tensor, values_like: torch.Tensor, rows: int, width: int) -> _GrowingLayer:
        """`rows` rows of `width` zero columns (keys and values shaped as the given ones'), in buffers with room to
        grow: allocated once, and only the columns in use written (zeros, so a masked column's keys and values are
        finite), where an update of zeros would allocate the zeros and then copy them into the buffers; for a
        slot per sequence over a few-shot prompt these are gigabytes."""
        layer = cls()
        layer.lazy_initialization(keys_like, values_like)
        layer._buffers = tuple(_room(states, rows, width) for states in (keys_like, values_like))
        for buffer in layer._buffers:
            buffer[:, :, :width].zero_()
        layer.keys, layer.values = (buffer[:, :, :width] for buffer in layer._buffers)
        return layer

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keys and values in tensors of their own (a copy), the buffers let go."""
        self.keys, self.values, self._buffers = keys, values, None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._buffers = None
        super().batch_select_indices(indices)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        new = old + key_states.shape[-2]
        buffers = self._buffers
        if buffers is None or new > buffers[0].shape[2] or not (_view_of(self.keys, buffers[0])
                                                                 and _view_of(self.values, buffers[1])):
            buffers = tuple(_room(states, states.shape[0], new) for states in (key_states, value_states))
            if old:
                buffers[0][:, :, :old] = self.keys
                buffers[1][:, :, :old] = self.values
            self._buffers = buffers
        buffers[0][:, :, old:new] = key_states
        buffers[1][:, :, old:new] = value_states
        self.keys, self.values = buffers[0][:, :, :new], buffers[1][:, :, :new]
        return self.keys, self.values


def _room(like: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """An uninitialised buffer for `rows` rows of `width` columns and room to grow: a copy per quarter of growth,
    amortised, for a quarter more memory."""
    return like.new_empty(rows, like.shape[1], _with_room(width), like.shape[3])


def _with_room(width: int) -> int:
    return width + max(64, width // 4)


def slot_columns(longest: int) -> int:
    """The most columns a slot row's buffers hold while its sequences are at most `longest` tokens: the width is
    the longest live sequence plus the stale columns Slots.trim lets pile up (under 1/TRIM_FRACTION of the width,
    and a column or two a step before it cuts), and a buffer keeps room to grow past that (_room)."""
    return _with_room(longest + longest // (TRIM_FRACTION - 1) + 2)


def _view_of(states: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether `states` is still the buffer's first columns (rows and strides unchanged)."""
    return (states.dim() == 4 and states.data_ptr() == buffer.data_ptr() and states.stride() == buffer.stride()
            and states.shape[:2] == buffer.shape[:2])
