"""`raylm eval --decontaminate`: which of a run's documents a contamination scan (raylm.results.contamination)
found clean, and a native task's metrics over those alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from raylm.config import EvalConfig
from raylm.results.contamination import CleanSets, decontaminated_key
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.scoring.sums import shard_sums
from raylm.tasks import get_task
from raylm.tasks.native import TaskDocs

if TYPE_CHECKING:
    from raylm.tasks.lmeval.build import Built


def clean_documents(cfg: EvalConfig, scan: CleanSets, docs: TaskDocs, built: Built | None
                    ) -> tuple[dict[str, set[int]], dict[str, int]]:
    """Each task's evaluated documents (its --limit or --samples ones) that the scan found clean, and how many it
    evaluates, after checking the scan holds exactly those texts: native tasks' by their lm-eval counterpart's
    query rule, lm-eval tasks' by lm-eval's (raylm.tasks.queries, raylm.tasks.lmeval.queries). Documents go by
    their own index in the task, as the scan names them: a native document's doc_id, and what an lm-eval
    document's --samples doc_id (renumbered by lm-eval) stands for (raylm.tasks.lmeval.build.documents)."""
    from raylm.tasks.queries import native_queries

    evaluated: dict[str, list[tuple[int, str]]] = {}
    for name, (task_docs, _) in docs.items():
        queries = native_queries(name, cfg.data_dir)
        evaluated[name] = [(d.doc_id, queries[d.doc_id]) for d in task_docs]
    if built is not None:
        from raylm.tasks.lmeval.queries import document_queries

        for name, task in built.tasks["tasks"].items():
            evaluated[name] = list(document_queries(name, task, cfg.limit, built.indices(name)))
    return ({name: scan.clean(name, queries) for name, queries in evaluated.items()},
            {name: len(queries) for name, queries in evaluated.items()})


def native_decontaminated(name: str, kind: str, scored: pa.Table, clean: set[int]) -> dict[str, float]:
    """A native task's metrics over its clean documents alone, under lm-eval's `_decontaminate` names (none when
    no document is clean, as lm-eval had no values to aggregate)."""
    import pyarrow.compute as pc

    if not clean:
        return {}
    sums = shard_sums(kind, scored.filter(pc.is_in(scored["doc_id"], pa.array(sorted(clean), pa.int64()))))
    metrics = rolling_metrics(sums) if kind == "rolling" else choice_metrics(sums, get_task(name).choice_metrics)
    return {decontaminated_key(key): value for key, value in metrics.items()}
