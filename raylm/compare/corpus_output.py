"""A `raylm ppl` / `raylm kl` --output directory as a run (a sweep's corpus point is one too): results.json's
figures, the corpus's, each domain's (--domain-column) and their macro average, as tasks in lm-eval's shape
(`ppl`, `ppl/<domain>`, `ppl macro`, each figure under `<figure>,none`), so that the report shows and charts them
as it does tasks; and samples/<label>.parquet, a row per document, which compare pairs by position
(raylm.compare.corpus_pairing)."""

from __future__ import annotations

from typing import Any

from raylm.compare.run import Run, read_results
from raylm.results.corpus_labels import COMMANDS, LABELS
from raylm.errors import RaylmError
from raylm.results.metrics import figures
from raylm.storage.location import Location


def is_corpus(results: dict[str, Any]) -> bool:
    return results.get("config", {}).get("command") in COMMANDS


def domain_task(label: str, domain: str) -> str:
    return f"{label}/{domain}"


def macro_task(label: str) -> str:
    return f"{label} macro"


def _figures(numbers: dict[str, Any]) -> dict[str, float]:
    """The figures (raylm.results.metrics.figures) under lm-eval's `,none` keys."""
    return {f"{key},none": value for key, value in figures(numbers).items()}


def corpus_run(where: Location, results: dict[str, Any]) -> Run:
    numbers = results.get("results", {})
    if len(numbers) != 1:
        raise RaylmError(f"{where / 'results.json'}: a corpus run's results hold one label ({', '.join(LABELS)}), "
                         f"got {', '.join(numbers) or 'none'}")
    (label, corpus), = numbers.items()
    tasks = {label: _figures(corpus)}
    tasks.update({domain_task(label, name): _figures(domain) for name, domain in corpus.get("domains", {}).items()})
    if "macro" in corpus:
        tasks[macro_task(label)] = _figures(corpus["macro"])
    shaped = {"results": tasks, "config": results.get("config", {}),
              # every figure is a loss, a perplexity or a disagreement: lower is better
              "higher_is_better": {task: {key.split(",")[0]: False for key in figures}
                                   for task, figures in tasks.items()}}
    samples = where / "samples" / f"{label}.parquet"
    return Run(str(where), shaped, {label: samples} if samples.is_file() else {}, corpus=label)


def find(where: Location) -> list[Run]:
    if not (where / "results.json").is_file():
        return []
    results = read_results(where / "results.json")
    return [corpus_run(where, results)] if is_corpus(results) else []
