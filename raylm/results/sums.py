"""Sums -> merged sums: a task's per-shard sums (raylm.scoring.sums) and a corpus's per-batch sums, merged into what
the metrics are computed from.

Everything the metrics need is a plain sum: counts add exactly, NLL and KL add in float64 with `math.fsum`.
Merging sums therefore gives the same metrics as reducing every result at once, however the work was cut into
shards or batches (up to one float64 rounding per part).
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute

CORPUS_COUNTS = ("tokens", "words", "bytes", "chars")
_KL_COLUMNS = {"kl_sum": "kl", "nll_sum_p": "nll_p", "nll_sum_q": "nll_q"}


class ExactSum:
    """A float64 sum kept exact as Shewchuk's non-overlapping partials (what math.fsum keeps inside), so that its
    value is the correctly rounded sum of every number added, however they were cut into batches and in whatever
    order: a resumed corpus run adds the same per-document numbers and gets the same bits."""

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, values: list[float]) -> None:
        partials = self.partials
        for x in values:
            i = 0
            for y in partials:
                if abs(x) < abs(y):
                    x, y = y, x
                hi = x + y
                lo = y - (hi - x)
                if lo:
                    partials[i] = lo
                    i += 1
                x = hi
            partials[i:] = [x]

    @property
    def value(self) -> float:
        return math.fsum(self.partials)


class CorpusSums:
    """Running sums of per-document rows of `raylm ppl` (column nll; pll for a masked LM) or `raylm kl` (kl,
    nll_p, nll_q): counts exactly, floats exactly (ExactSum)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.floats: dict[str, ExactSum] = {}

    def add(self, rows: pa.Table) -> None:
        counts = {"docs": rows.num_rows, **{key: int(pa.compute.sum(rows[key]).as_py() or 0)
                                            for key in (*CORPUS_COUNTS, "argmax_disagree") if key in rows.column_names}}
        for key, value in counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        for key, column in _float_columns(rows).items():
            self.floats.setdefault(key, ExactSum()).add(rows[column].to_pylist())

    def value(self) -> dict[str, float]:
        return {**self.counts, **{key: total.value for key, total in self.floats.items()}}


def _float_columns(rows: pa.Table) -> dict[str, str]:
    if "nll" in rows.column_names:
        return {"nll_sum": "nll"}
    if "pll" in rows.column_names:
        return {"pll_sum": "pll"}
    return _KL_COLUMNS


def corpus_batch_sums(rows: pa.Table) -> dict[str, float]:
    """Sums of one batch of per-document rows (CorpusSums)."""
    sums = CorpusSums()
    sums.add(rows)
    return sums.value()


def merge(parts: list[dict[str, float]]) -> dict[str, float]:
    """Key by key: floats with math.fsum (exactly rounded, so the order of parts does not matter), counts exactly."""
    if not parts:
        return {}
    return {key: math.fsum(p[key] for p in parts) if isinstance(parts[0][key], float) else sum(p[key] for p in parts)
            for key in parts[0]}
