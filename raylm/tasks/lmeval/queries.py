"""Each lm-eval task document's decontamination query: the text of it a training corpus is searched for.

lm-eval 0.4.13 still defines the query (ConfigurableTask.doc_to_decontamination_query) but no longer uses it:
the evaluator path that did was removed in 0.4.2 (PR #1533). Its rule, which raylm follows:
- a task that sets `should_decontaminate: true` is searched for by its `doc_to_decontamination_query`: a field of
  the document, a `!function`, or a Jinja template; without one, by `doc_to_text`. A task class that overrides the
  method (squadv2, scrolls) is asked through it;
- a task that does not set it has no query in lm-eval; raylm takes the text lm-eval falls back to when the flag is
  set without a query, `doc_to_text` (the question without its few-shot examples or answer choices), except
  where that is not the document's text: a rolling-loglikelihood task's `doc_to_text` is empty, and its text is
  `doc_to_target` (what lm-eval's PerplexityTask returned as its query: the document itself); a multiple-input
  task's (winogrande's form) is the index of the gold choice, and its text is that choice, the target delimiter
  and the target, the gold request's context and continuation as one text.

One deviation, for a bug: lm-eval renders a template query and then parses the text with ast.literal_eval
(copied from doc_to_choice, whose templates render Python lists). Ordinary text is not a Python literal, so
every template query raises there (wikitext's `{{page}}`, or any sentence); raylm keeps the rendered text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lm_eval.api.task import ConfigurableTask
from lm_eval.evaluator_utils import get_sample_size

from raylm.errors import RaylmError
from raylm.tasks.lmeval.build import LMEVAL_LOCK, cached_templates, documents


def query_rule(task: Any) -> str:
    """Which text the task is searched for, in words (for reports)."""
    if _overrides_query(task):
        return f"{type(task).__name__}.doc_to_decontamination_query"
    config = task.config
    if getattr(config, "should_decontaminate", False):
        query = config.doc_to_decontamination_query
        if query is None:
            return "doc_to_text (should_decontaminate, no doc_to_decontamination_query)"
        return f"doc_to_decontamination_query: {getattr(query, '__name__', query)}"
    if task.OUTPUT_TYPE == "loglikelihood_rolling":
        return "doc_to_target (rolling loglikelihood: the document itself; no should_decontaminate)"
    if getattr(task, "multiple_input", 0):
        return "gold choice + target delimiter + doc_to_target (multiple inputs; no should_decontaminate)"
    return "doc_to_text (lm-eval's default; no should_decontaminate)"


def document_queries(name: str, task: Any, limit: int | float | None, samples: list[int] | None = None
                     ) -> Iterator[tuple[int, str]]:
    """(index, query) for the documents `raylm eval --limit` or `--samples` would score, in lm-eval's order, each
    by its own index in the task (a scan's doc_id; under --samples not the doc_id lm-eval renumbers it to)."""
    with LMEVAL_LOCK, cached_templates():
        for _, index, doc in documents(task, get_sample_size(task, limit), samples):
            yield index, _as_text(name, index, _query(task, doc))


def _overrides_query(task: Any) -> bool:
    return type(task).doc_to_decontamination_query is not ConfigurableTask.doc_to_decontamination_query


def _query(task: Any, doc: dict) -> Any:
    if _overrides_query(task):
        return task.doc_to_decontamination_query(doc)
    config = task.config
    if getattr(config, "should_decontaminate", False):
        query = config.doc_to_decontamination_query
        if isinstance(query, str) and query not in task.features:
            from lm_eval.utils import apply_template

            return apply_template(query, doc)
        return task.doc_to_decontamination_query(doc)
    if task.OUTPUT_TYPE == "loglikelihood_rolling":
        return task.doc_to_target(doc)
    text = task.doc_to_text(doc)
    if getattr(task, "multiple_input", 0) and isinstance(text, int):
        delimiter = task.config.target_delimiter
        return f"{task.doc_to_choice(doc)[text]}{delimiter}{task.doc_to_target(doc)}"
    return text


def _as_text(name: str, doc_id: int, query: Any) -> str:
    if isinstance(query, str):
        return query
    if isinstance(query, (list, tuple)) and all(isinstance(q, str) for q in query):
        return " ".join(query)
    raise RaylmError(f"lm-eval task '{name}': doc {doc_id}: its decontamination query is {type(query).__name__}, "
                     "not text")
