"""The native tasks' samples as lm-eval logs them, for their `samples_<task>_<date>.jsonl` (raylm.results.sample_logs).

Every field is computed by lm-eval's own code: the native task's counterpart (raylm.tasks.lmeval.counterparts)
built on the same rows gives the doc, target and request strings, and raylm's scores go through lm-eval's
filters and process_results (raylm.results.lmeval) for the per-document metrics and hashes. The counterpart's
requests must be exactly the ones raylm scored, string for string, or the log would pair lm-eval's prompts with
other prompts' scores: any difference is an error naming the task, document and request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from raylm.errors import RaylmError
from raylm.results.lmeval import Score, ScoreKey, results, task_scores
from raylm.tasks import ChoiceDoc, Doc, TextDoc
from raylm.tasks.lmeval.build import Built
from raylm.tasks.prompt import PromptFormat, render


def native_samples(built: Built, docs: dict[str, list[Doc]], scored: dict[str, pa.Table],
                   prompt: PromptFormat) -> dict[str, list[dict[str, Any]]]:
    """Each native task's logged samples from its counterpart `built` for the same run, the documents raylm
    scored (in order, few-shot examples attached) and their scored rows."""
    scores: dict[ScoreKey, Score] = {}
    for name in built.tasks["tasks"]:
        requests = built.requests(name)
        _check_requests(name, docs[name], [(r.doc_id, r.idx, tuple(r.arguments)) for r in requests],
                        list(_arguments(docs[name], prompt)))
        requested = pa.table({"doc_id": [r.doc_id for r in requests], "req_idx": [r.idx for r in requests]})
        scores.update(task_scores(name, built.output_type(name), requested, _renumbered(docs[name], scored[name])))
    return results(built, scores, bootstrap_iters=0)["samples"]


Keyed = tuple[int, int, tuple[str, ...]]  # (document's position in the run, request index, request strings)


def logged_doc_hashes(name: str, samples: list[dict[str, Any]]) -> dict[int, str]:
    """Each document's doc_hash as lm-eval logged it, by doc_id (lm-eval logs a native task's documents under
    their own doc_id, --samples' too): lm-eval's hash of the doc its task processed (HellaSwag's with the query,
    choices and gold its process_docs adds), so that the Parquet's documents pair with lm-eval's own run's."""
    out: dict[int, str] = {}
    for sample in samples:
        doc_id, value = sample["doc_id"], sample["doc_hash"]
        if out.setdefault(doc_id, value) != value:
            raise RaylmError(f"{name}: lm-eval logged doc {doc_id} under two doc_hash values")
    return out


def _arguments(docs: list[Doc], prompt: PromptFormat) -> Iterator[Keyed]:
    """Every request raylm scored for these documents, in order."""
    for position, doc in enumerate(docs):
        if isinstance(doc, TextDoc):
            yield position, 0, (doc.text,)
        elif isinstance(doc, ChoiceDoc):
            rendered = render(doc, prompt)
            for idx, pair in enumerate(zip(rendered.contexts, rendered.continuations)):
                yield position, idx, pair


def _check_requests(name: str, docs: list[Doc], theirs: list[Keyed], ours: list[Keyed]) -> None:
    for their, our in zip(theirs, ours):
        if their != our:
            raise RaylmError(f"{name}: doc {docs[our[0]].doc_id} request {our[1]}: lm-eval's own {name} builds "
                             f"{their[2]!r} (doc {their[0]}, request {their[1]}), raylm scored {our[2]!r}")
    if len(theirs) != len(ours):
        raise RaylmError(f"{name}: lm-eval's own {name} builds {len(theirs)} requests, raylm scored {len(ours)}")


def _renumbered(docs: list[Doc], scored: pa.Table) -> pa.Table:
    """The scored rows keyed as lm-eval keys the counterpart's requests: documents by their position in the run
    (lm-eval renumbers --samples documents from 0), and a rolling document's windows (raylm's req_idx) as the
    windows of its one request."""
    position = {doc.doc_id: k for k, doc in enumerate(docs)}
    doc_ids = [position[d] for d in scored["doc_id"].to_pylist()]
    rolling = bool(docs) and isinstance(docs[0], TextDoc)
    req_idx = scored["req_idx"].to_pylist()
    zeros = [0] * scored.num_rows
    return pa.table({"doc_id": doc_ids, "req_idx": zeros if rolling else req_idx,
                     "window": req_idx if rolling else zeros,
                     "loglikelihood": scored["loglikelihood"], "is_greedy": scored["is_greedy"]})
