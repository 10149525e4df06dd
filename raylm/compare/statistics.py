"""Paired differences between two runs scored on the same documents, with their standard errors.

Two models scored on the same documents make per-document differences d_i = b_i - a_i; the spread of the d_i is
what the difference's standard error depends on, and it is far smaller than the two runs' own spreads when the
runs agree on most documents (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640, section 4). A group's
documents are clustered by subtask (MMLU's subjects): documents of one subject are not independent draws, and the
cluster-robust standard error (section 3) sums the deviations within each cluster before squaring.

A corpus run's bits per byte is pooled, not a mean over documents: the corpus's NLL over its bytes. Its paired
difference is a ratio estimator's, whose standard error over documents follows by the delta method (a mean being
the ratio whose denominators are the documents' weights); a macro average over domains is a mean of independent
domains' differences.

Intervals and p-values are normal (z) ones, the paired z-test: the t distribution differs from it by less than
1% of the interval's width from n = 50 documents on, and the ratio of a mean to its clustered standard error has
no exact t distribution to use instead.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from raylm.results.metrics import NATS_PER_BIT, bits_per_unit

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval


@dataclass(frozen=True)
class Difference:
    """b - a over n paired documents: the means, the mean difference and its standard errors."""

    n: int
    a: float
    b: float
    diff: float
    diff_stderr: float  # sd of the per-document differences (n - 1 in the sd) / sqrt(n)
    unpaired_stderr: float  # sqrt(stderr_a² + stderr_b²): what the two runs' own stderrs would say
    ci95_low: float
    ci95_high: float
    p_value: float
    diff_stderr_clustered: float | None = None  # groups only; the interval and p-value then use it
    clusters: int | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON's view: nan (no standard error from one document) as null, the cluster keys for groups only."""
        out = {key: None if isinstance(value, float) and math.isnan(value) else value
               for key, value in asdict(self).items()}
        if self.clusters is None:
            del out["diff_stderr_clustered"], out["clusters"]
        return out


def ratio_stderr(num: np.ndarray, den: np.ndarray) -> float:
    """The standard error of a ratio estimator R = sum(num_i) / sum(den_i) over n independent documents, by the
    delta method: sqrt(n / (n - 1) sum((num_i - R den_i)²)) / sum(den_i). A pooled figure (bits per byte: NLL
    summed over bytes summed) is such a ratio, and so is a (weighted) mean (den_i = w_i). nan for fewer than 2
    documents."""
    n = len(num)
    if n < 2:
        return math.nan
    total = float(np.sum(den))
    residuals = num - (float(np.sum(num)) / total) * den
    return math.sqrt(n / (n - 1) * float(np.sum(residuals ** 2))) / total


def stderr_of_mean(x: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The standard error of a weighted mean sum(w_i x_i) (weights summing to 1), sqrt(n / (n - 1) sum(w_i² (x_i -
    mean)²)), the ratio estimator's with den_i = w_i: with equal weights the sample standard deviation (n - 1) /
    sqrt(n), lm-eval's stderr of a mean; nan for fewer than 2 values."""
    w = np.full(len(x), 1.0 / max(len(x), 1)) if weights is None else weights
    return ratio_stderr(w * x, w)


def clustered_stderr(d: np.ndarray, clusters: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Cluster-robust standard error of the weighted mean sum(w_i d_i) (weights summing to 1): sqrt(sum over
    clusters of (sum_i w_i (d_i - mean))²); with equal weights sqrt(sum over clusters of (sum_i (d_i - mean d))²) / n."""
    w = np.full(len(d), 1.0 / len(d)) if weights is None else weights
    centred = w * (d - np.dot(w, d))
    _, index = np.unique(clusters, return_inverse=True)
    per_cluster = np.bincount(index, weights=centred)
    return float(math.sqrt(float(np.sum(per_cluster ** 2))))


def z_test(diff: float, stderr: float) -> tuple[float, float, float]:
    """The 95% interval and the two-sided p-value of a mean difference with a normal standard error. A zero
    standard error (every document moved by the same amount) gives p = 0, or 1 when nothing moved."""
    if stderr == 0:
        p = 1.0 if diff == 0 else 0.0
    else:
        p = math.erfc(abs(diff / stderr) / math.sqrt(2)) if math.isfinite(stderr) else math.nan
    return diff - Z95 * stderr, diff + Z95 * stderr, p


def paired_difference(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None,
                      weights: np.ndarray | None = None) -> Difference:
    """b - a over documents paired by position; with `clusters` (one label per document: its subtask), the
    group's difference with its clustered standard error beside the plain paired one. `weights` (one per
    document, summing to 1) make every mean a weighted one: a group that weighs its subtasks otherwise than by
    their sizes (lm-eval's weight_by_size: false) gives each subtask's documents its share."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired values must be two equal, non-empty 1-d arrays, got {a.shape} and {b.shape}")
    w = None if weights is None else np.asarray(weights, np.float64)

    def mean(x: np.ndarray) -> float:
        return float(x.mean()) if w is None else float(np.dot(w, x))

    d = b - a
    diff, paired = mean(d), stderr_of_mean(d, w)
    unpaired = math.hypot(stderr_of_mean(a, w), stderr_of_mean(b, w))
    n_clusters = len(np.unique(clusters)) if clusters is not None else None
    clustered = None
    if n_clusters is not None:
        # One cluster's deviations sum to zero: a group of one subtask has no between-cluster spread to estimate,
        # and its interval is its subtask's own.
        clustered = clustered_stderr(d, np.asarray(clusters), w) if n_clusters > 1 else math.nan
    low, high, p = z_test(diff, clustered if clustered is not None and n_clusters > 1 else paired)
    return Difference(len(d), mean(a), mean(b), diff, paired, unpaired, low, high, p,
                      clustered, n_clusters)


def pooled_bits_difference(nll_a: np.ndarray, nll_b: np.ndarray, units: np.ndarray) -> Difference:
    """b - a in bits per unit pooled over the documents, sum(NLL) / sum(units) / ln 2: a corpus run's bits per
    byte, computed as the run computes it (raylm.results.metrics.bits_per_unit) from the same per-document NLLs
    (nats) summed exactly, so that a and b are the run's own numbers to the bit. Its standard error is the ratio
    estimator's over documents (ratio_stderr) of d_i = (nll_b_i - nll_a_i) / ln 2 over units_i; the unpaired one
    each run's alike."""
    nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
    units = np.asarray(units, np.int64)
    if not nll_a.shape == nll_b.shape == units.shape or nll_a.ndim != 1 or units.sum() <= 0:
        raise ValueError(f"pooled values need equal 1-d arrays with units to divide by, got {nll_a.shape}, "
                         f"{nll_b.shape} and {units.shape} ({units.sum()} units)")
    total = int(units.sum())
    a, b = (bits_per_unit(math.fsum(nll.tolist()), total) for nll in (nll_a, nll_b))
    diff = b - a
    paired = ratio_stderr((nll_b - nll_a) / NATS_PER_BIT, units)
    unpaired = math.hypot(ratio_stderr(nll_a / NATS_PER_BIT, units), ratio_stderr(nll_b / NATS_PER_BIT, units))
    return Difference(len(units), a, b, diff, paired, unpaired, *z_test(diff, paired))


def macro_difference(parts: list[Difference]) -> Difference:
    """The unweighted mean over parts (a corpus's domains: Paloma's macro average) of their a, b and differences,
    its standard error sqrt(sum(se_k²)) / k, the parts being independent (disjoint documents); n their total."""
    k = len(parts)
    a, b = (math.fsum(getattr(p, side) for p in parts) / k for side in ("a", "b"))
    paired, unpaired = (math.sqrt(math.fsum(getattr(p, se) ** 2 for p in parts)) / k
                        for se in ("diff_stderr", "unpaired_stderr"))
    return Difference(sum(p.n for p in parts), a, b, b - a, paired, unpaired, *z_test(b - a, paired))


def shown_stderr(numbers: dict[str, float | int | None]) -> float | None:
    """The standard error a comparison's interval and p-value use (Difference.as_dict's view): the clustered one
    where a group has it, else the paired one."""
    clustered = numbers.get("diff_stderr_clustered")
    return clustered if clustered is not None else numbers["diff_stderr"]
