"""Ray Data callables that load a model and score batches of corpus documents: the actors of `raylm ppl`,
`raylm kl` and `raylm membership`.

Each class loads its model(s) once per actor in __init__ (DeferredStartup: a failed load is one line at the first
call), then is called on Arrow batches; equally a plain object tests call in-process. The per-document maths is
raylm.scoring.documents (and raylm.scoring.kl): a batch holds whole documents, scored together and summed back
per document in float64 before anything is returned.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import torch

from raylm.cluster.devices import assigned_gpus, device_here
from raylm.cluster.failures import DeferredStartup
from raylm.models.devices import WEIGHTS_FRACTION, gpu_budget
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.documents import window_documents
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.scoring.documents import PREFIX_SHARING_COLUMN, DocumentNLL, DocumentPLL
from raylm.scoring.kl import KLScorer
from raylm.scoring.membership import min_k_prob, zlib_ratio
from raylm.scoring.mlm import MaskedScorer
from raylm.scoring.scorer import Scorer


class DocPerplexity(DeferredStartup):
    """Per-document NLL (raylm.scoring.documents.DocumentNLL) on a model of its own."""

    def start(self, spec: ModelSpec, max_length: int, stride: int, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        encoder = Encoder(load_tokenizer(spec), max_length)
        spec = device_here(spec)
        self.documents = DocumentNLL(encoder, Scorer(load_model(spec, gpus=assigned_gpus(spec)), max_length), stride)

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        return self.documents(batch)


class DocMembership(DocPerplexity):
    """`raylm membership`'s actor: a batch of (task, doc_id, text) -> per document its tokens, NLL, Min-K% Prob and
    zlib ratio (raylm.scoring.membership). Each text is scored whole as DocPerplexity scores a document over
    disjoint windows (lm-eval's rolling windows), so every token once, with the same packing, start-up check and
    logits budget (a window longer than the budget runs in pieces over the KV cache)."""

    def start(self, spec: ModelSpec, max_length: int, k: float, threads: int = 0) -> None:
        super().start(spec, max_length, max_length, threads)
        self.k = k

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        docs, (_, _, per_window) = self.documents.scored(batch, token_logprobs=True)
        parts: list[list[np.ndarray]] = [[] for _ in docs.texts]
        for owner, lp in zip(docs.owner.tolist(), per_window):
            parts[owner].append(lp)
        token_lps = [np.concatenate(p) if p else np.zeros(0) for p in parts]
        return pa.table({
            "task": batch["task"], "doc_id": batch["doc_id"],
            "tokens": pa.array([len(lp) for lp in token_lps], pa.int64()),
            "nll": pa.array([-math.fsum(lp.tolist()) for lp in token_lps], pa.float64()),
            "min_k_prob": pa.array([min_k_prob(lp, self.k) for lp in token_lps], pa.float64()),
            "zlib_ratio": pa.array([zlib_ratio(lp, t) for lp, t in zip(token_lps, docs.texts)], pa.float64()),
            **self.documents.verdict(len(token_lps)),
        })


def take_prefix_sharing(batch: pa.Table, verdicts: set[str]) -> pa.Table:
    """The batch without its PREFIX_SHARING_COLUMN, whose distinct verdicts are added to `verdicts` (the driver
    records them once per run, not per row)."""
    if PREFIX_SHARING_COLUMN not in batch.column_names:
        return batch
    verdicts.update(batch[PREFIX_SHARING_COLUMN].unique().to_pylist())
    return batch.drop_columns([PREFIX_SHARING_COLUMN])


class DocPseudoPerplexity(DeferredStartup):
    """A masked LM's PLL per document (raylm.scoring.documents.DocumentPLL) on a model of its own."""

    def start(self, spec: ModelSpec, max_length: int, stride: int, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.documents = DocumentPLL(MaskedEncoder(load_tokenizer(spec), max_length),
                                     MaskedScorer.from_spec(device_here(spec)), stride)

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        return self.documents(batch)


class DocKL(DeferredStartup):
    """KL(P || Q) per document, P = spec_p and Q = spec_q both resident in this one process."""

    def start(self, spec_p: ModelSpec, spec_q: ModelSpec, max_length: int, stride: int, threads: int = 0,
              width: int | None = None) -> None:
        """`width`: the ids both distributions are compared over (raylm.corpus.run.kl_width)."""
        if threads:
            torch.set_num_threads(threads)
        self.encoder = Encoder(load_tokenizer(spec_p), max_length)
        spec_p, spec_q = device_here(spec_p), device_here(spec_q)
        gpus = assigned_gpus(spec_p)
        # Two models over one actor's GPUs: each may take half of what one model would (budgets read before
        # either loads, while the GPUs are empty).
        budgets = [gpu_budget(gpus, WEIGHTS_FRACTION / 2)] * 2 if gpus > 1 else [None, None]
        self.scorer = KLScorer(load_model(spec_p, budget=budgets[0]), load_model(spec_q, budget=budgets[1]),
                               max_length, width=width)
        self.stride = stride

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        docs = window_documents(batch, self.encoder, self.stride)
        scores = self.scorer.score(docs.contexts, docs.continuations)
        return pa.table({
            **docs.counts(batch),
            "kl": pa.array(docs.per_doc(scores.kl), pa.float64()),
            "nll_p": pa.array(docs.per_doc(scores.nll_p), pa.float64()),
            "nll_q": pa.array(docs.per_doc(scores.nll_q), pa.float64()),
            "argmax_disagree": pa.array(np.bincount(docs.owner, scores.disagree, len(docs.texts)).astype(np.int64)),
        })
