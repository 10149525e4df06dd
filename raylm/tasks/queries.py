"""Each native task document's decontamination query: the text of it that a training corpus is searched for.

A native task uses the rule of the lm-eval task it reproduces (lm-eval 0.4.13's YAMLs), so that `raylm
contamination` gives one answer whichever implementation is asked for:
- winogrande sets `should_decontaminate: true` and `doc_to_decontamination_query: sentence`: the row's sentence,
  blank and all;
- wikitext sets `doc_to_decontamination_query: "{{page}}"`: the page as the dataset holds it (before lm-eval's
  detokenizer, which only the model sees);
- hellaswag sets neither, so its query is lm-eval's default, `doc_to_text`: the preprocessed
  "activity label: context" both implementations prompt with.
Queries are listed by doc_id, the row index every native task numbers its documents by.
"""

from __future__ import annotations

from pathlib import Path

from raylm.tasks import hellaswag, wikitext, winogrande
from raylm.tasks.base import ChoiceDoc

# How each native task's query is defined, as lm-eval's counterpart states it (for reports and the docs).
QUERY_RULES = {
    "hellaswag": "doc_to_text (lm-eval's default: hellaswag sets no doc_to_decontamination_query)",
    "winogrande": "doc_to_decontamination_query: sentence",
    "wikitext": "doc_to_decontamination_query: {{page}}",
}


def native_queries(name: str, data_dir: Path | None) -> list[str]:
    """The query of every document of native task `name`, doc_id order."""
    if name == "hellaswag":
        return [doc.contexts[0] for doc in hellaswag.load_docs(data_dir) if isinstance(doc, ChoiceDoc)]
    if name == "winogrande":
        return [row.get("sentence", str) for row in winogrande.load_rows(data_dir)]
    if name == "wikitext":
        return [row.get("page", str) for row in wikitext.load_rows(data_dir)]
    raise KeyError(name)
