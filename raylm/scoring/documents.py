"""A batch of corpus documents -> one row of sums per document, on a model already loaded: the maths of
`raylm ppl` (and `raylm membership`), whoever holds the model.

The corpus commands' Ray Data actors (raylm.corpus.doc_scoring) load a model for it; a sweep's resident scoring
actor (raylm.cluster.actors) runs it on the model it keeps for the sweep's tasks. A batch holds whole documents,
so a document's windows never leave the call that made them: windows from all documents in the batch are scored
together and summed back per document, in float64 with math.fsum, before anything is returned.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from raylm.requests.documents import WindowedDocs, document_texts, window_documents
from raylm.requests.encoding import Encoder
from raylm.requests.masked import UNSCORED, MaskedEncoder
from raylm.scoring.mlm import MaskedScorer
from raylm.scoring.scorer import Scorer
from raylm.scoring.startup_check import REAL_REQUESTS, checked_plan

PREFIX_SHARING_COLUMN = "prefix_sharing"  # DocumentNLL's verdict, taken off its rows by the driver


class DocumentNLL:
    """Per-document NLL from a causal Scorer. Windows of different documents may share a row (WikiText's short
    headings share BOS and " = "), so a model no test has proven is start-up checked on its first batch's windows,
    as eval actors are on their first shard; each output row carries the verdict (PREFIX_SHARING_COLUMN) for the
    driver to record."""

    def __init__(self, encoder: Encoder, scorer: Scorer, stride: int):
        self.encoder, self.scorer, self.stride = encoder, scorer, stride

    def __call__(self, batch: pa.Table) -> pa.Table:
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


class DocumentPLL:
    """A masked LM's PLL per document (raylm.scoring.mlm), from windows that score each token once
    (raylm.requests.masked); `tokens` counts the tokens scored."""

    def __init__(self, encoder: MaskedEncoder, scorer: MaskedScorer, stride: int):
        self.encoder, self.scorer, self.stride = encoder, scorer, stride

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = document_texts(batch)
        windowed = self.encoder.document_windows(texts, self.stride)
        windows = [w for doc in windowed for w in doc]
        loglik, _ = self.scorer.score([w.context for w in windows], [w.continuation for w in windows],
                                      [w.following for w in windows], [w.word_ids for w in windows])
        owner = np.repeat(np.arange(len(texts)), [len(doc) for doc in windowed])
        tokens = [sum(t != UNSCORED for w in doc for t in w.word_ids) for doc in windowed]
        docs = WindowedDocs(texts, tokens, [], [], owner)
        return pa.table({**docs.counts(batch), "pll": pa.array(docs.per_doc(loglik), pa.float64())})


def document_scorer(tokenizer, scorer: Scorer | MaskedScorer, max_length: int, stride: int
                    ) -> DocumentNLL | DocumentPLL:
    """The per-document scorer for a loaded model of either kind, windows of at most `max_length` tokens."""
    if isinstance(scorer, MaskedScorer):
        return DocumentPLL(MaskedEncoder(tokenizer, max_length), scorer, stride)
    return DocumentNLL(Encoder(tokenizer, max_length), scorer, stride)
