"""`raylm ppl --output DIR` outputs written without Ray, through raylm's own pieces: DocPerplexity (the actors'
code) scores the documents in-process; the driver's steps (raylm.corpus.run._stream) drop the prefix-sharing
verdict, number the documents, write them with PartialParquet and sum them, the corpus and each domain, with
CorpusSums; domain_metrics and results_dict make results.json as run_corpus writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute

from raylm.corpus.doc_scoring import DocPerplexity, take_prefix_sharing
from raylm.corpus.read import PATH_DOMAIN
from raylm.corpus.run import CorpusConfig, CorpusResult, domain_metrics, results_dict
from raylm.corpus.stream import PartialParquet
from raylm.models.spec import ModelSpec
from raylm.results.metrics import ppl_metrics
from raylm.results.report import prefix_sharing
from raylm.results.sums import CorpusSums
from raylm.storage.atomic import write_atomic
from raylm.storage.location import location


def write_ppl_output(out: Path, spec: ModelSpec, corpus: pa.Table, max_length: int,
                     domain_column: str | None = PATH_DOMAIN) -> Path:
    """`corpus` (text and path columns, a `domain` one for another --domain-column) scored as one batch."""
    cfg = CorpusConfig(spec, "corpus/*.jsonl", max_length=max_length, domain_column=domain_column, progress=False)
    verdicts: set[str] = set()
    rows = take_prefix_sharing(DocPerplexity(spec, max_length, max_length)(corpus), verdicts)
    rows = rows.add_column(0, "doc", pa.array(range(rows.num_rows), pa.int64()))
    with PartialParquet(location(out) / "samples" / "ppl.parquet") as samples:
        samples.write(rows)
    total = CorpusSums()
    total.add(rows)
    domains = None
    if domain_column is not None:
        column = rows["path" if domain_column == PATH_DOMAIN else "domain"]
        domains = {}
        for name in column.unique().to_pylist():
            sums = domains[name] = CorpusSums()
            sums.add(rows.filter(pa.compute.equal(column, name)))
        domains = {name: sums.value() for name, sums in domains.items()}
    metrics = domain_metrics(ppl_metrics, total.value(), domains)
    result = CorpusResult(cfg, metrics, max_length, max_length, 1.0, [None], prefix_sharing(verdicts))
    write_atomic(location(out) / "results.json", json.dumps(results_dict(result), indent=2, default=str).encode())
    return out
