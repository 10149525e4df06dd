"""A batch of corpus documents -> one row of sums per document: the unit of work of `raylm ppl`, `raylm kl` and
`raylm membership`.

Each class is a Ray Data callable (model loaded once per actor in __init__, then called on Arrow batches), and
equally a plain object tests call in-process. A batch holds whole documents, so a document's windows never
leave the call that made them: windows from all documents in the batch are scored together and summed back
per document, in float64 with math.fsum, before anything is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from raylm.cluster.devices import assigned_gpus, device_here
from raylm.cluster.failures import DeferredStartup
from raylm.corpus.read import document_domains, document_texts
from raylm.models.devices import WEIGHTS_FRACTION, gpu_budget
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.masked import UNSCORED, MaskedEncoder
from raylm.requests.windows import split_conditioning, strided_windows
from raylm.scoring.kl import KLScorer
from raylm.scoring.membership import min_k_prob, zlib_ratio
from raylm.scoring.mlm import MaskedScorer
from raylm.scoring.scorer import Scorer
from raylm.scoring.startup_check import REAL_REQUESTS, checked_plan

PREFIX_SHARING_COLUMN = "prefix_sharing"  # DocPerplexity's verdict, taken off its rows by the driver


@dataclass
class WindowedDocs:
    """Every window of a batch of documents, flat, with the document each came from (`owner`)."""

    texts: list[str]
    tokens: list[int]
    contexts: list[list[int]]
    continuations: list[list[int]]
    owner: np.ndarray

    def per_doc(self, values: np.ndarray) -> list[float]:
        """Sum per-window values into their documents, exactly rounded."""
        parts: list[list[float]] = [[] for _ in self.texts]
        for doc, value in zip(self.owner.tolist(), values.tolist()):
            parts[doc].append(value)
        return [math.fsum(p) for p in parts]

    def counts(self, batch: pa.Table) -> dict[str, pa.Array]:
        """What the per-unit perplexities divide by: whitespace words, UTF-8 bytes, characters of each text; and
        each document's file and domain (--domain-column), which group them."""
        return {
            "path": batch["path"],
            **({"domain": document_domains(batch)} if "domain" in batch.column_names else {}),
            "tokens": pa.array(self.tokens, pa.int64()),
            "words": pa.array([len(t.split()) for t in self.texts], pa.int64()),
            "bytes": pa.array([len(t.encode("utf-8")) for t in self.texts], pa.int64()),
            "chars": pa.array([len(t) for t in self.texts], pa.int64()),
        }


def window_documents(batch: pa.Table, encoder: Encoder, stride: int) -> WindowedDocs:
    """Every document's strided windows. Documents are encoded by the tokenizer itself, not by the Encoder's
    lm-eval rule (which the WikiText task keeps): a Llama tokenizer's BOS then conditions each document instead
    of being scored after a second BOS and counted as a token (see split_conditioning)."""
    texts = document_texts(batch)
    contexts, continuations, owner, tokens = [], [], [], []
    encoded = encoder.tokenizer(texts)["input_ids"] if texts else []
    for doc, ids in enumerate(encoded):
        first, scored = split_conditioning(list(ids), encoder.prefix_token)
        tokens.append(len(scored))
        for context, continuation in strided_windows(scored, first, encoder.max_length, stride):
            contexts.append(context)
            continuations.append(continuation)
            owner.append(doc)
    return WindowedDocs(texts, tokens, contexts, continuations, np.array(owner, dtype=np.int64))


class DocPerplexity(DeferredStartup):
    """Per-document NLL. Windows of different documents may share a row (WikiText's short headings share BOS and
    " = "), so a model no test has proven is start-up checked on its first batch's windows, as eval actors are on
    their first shard; each output row carries the verdict (PREFIX_SHARING_COLUMN) for the driver to record."""

    def start(self, spec: ModelSpec, max_length: int, stride: int, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.encoder = Encoder(load_tokenizer(spec), max_length)
        spec = device_here(spec)
        self.scorer = Scorer(load_model(spec, gpus=assigned_gpus(spec)), max_length)
        self.stride = stride

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        docs, (loglik, _) = self.scored(batch)
        nll = [-x for x in docs.per_doc(loglik)]
        return pa.table({**docs.counts(batch), "nll": pa.array(nll, pa.float64()), **self.verdict(len(nll))})

    def scored(self, batch: pa.Table, token_logprobs: bool = False) -> tuple[WindowedDocs, tuple]:
        """The batch's windows and the Scorer's answer for them (Scorer.score's tuple)."""
        docs = window_documents(batch, self.encoder, self.stride)
        if self.scorer.plan.needs_check:
            real = (docs.contexts[:REAL_REQUESTS], docs.continuations[:REAL_REQUESTS])
            self.scorer.plan = checked_plan(self.scorer.model, self.scorer.max_length, self.scorer.plan, real)
        return docs, self.scorer.score(docs.contexts, docs.continuations, token_logprobs=token_logprobs)

    def verdict(self, rows: int) -> dict[str, pa.Array]:
        return {PREFIX_SHARING_COLUMN: pa.array([self.scorer.plan.prefix_sharing] * rows, pa.string())}


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
        docs, (_, _, per_window) = self.scored(batch, token_logprobs=True)
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
            **self.verdict(len(token_lps)),
        })


def take_prefix_sharing(batch: pa.Table, verdicts: set[str]) -> pa.Table:
    """The batch without its PREFIX_SHARING_COLUMN, whose distinct verdicts are added to `verdicts` (the driver
    records them once per run, not per row)."""
    if PREFIX_SHARING_COLUMN not in batch.column_names:
        return batch
    verdicts.update(batch[PREFIX_SHARING_COLUMN].unique().to_pylist())
    return batch.drop_columns([PREFIX_SHARING_COLUMN])


class DocPseudoPerplexity(DeferredStartup):
    """A masked LM's PLL per document (raylm.scoring.mlm), from windows that score each token once
    (raylm.requests.masked); `tokens` counts the tokens scored."""

    def start(self, spec: ModelSpec, max_length: int, stride: int, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.encoder = MaskedEncoder(load_tokenizer(spec), max_length)
        self.scorer: MaskedScorer = MaskedScorer.from_spec(device_here(spec))
        self.stride = stride

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.check_started()
        texts = document_texts(batch)
        windowed = self.encoder.document_windows(texts, self.stride)
        windows = [w for doc in windowed for w in doc]
        loglik, _ = self.scorer.score([w.context for w in windows], [w.continuation for w in windows],
                                      [w.following for w in windows], [w.word_ids for w in windows])
        owner = np.repeat(np.arange(len(texts)), [len(doc) for doc in windowed])
        tokens = [sum(t != UNSCORED for w in doc for t in w.word_ids) for doc in windowed]
        docs = WindowedDocs(texts, tokens, [], [], owner)
        return pa.table({**docs.counts(batch), "pll": pa.array(docs.per_doc(loglik), pa.float64())})


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
