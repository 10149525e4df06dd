"""Native tasks' request tables for a run's config, built as `raylm eval` builds them (raylm.evaluate's readers of
the config), with each task's document count before --limit: for tests that score requests without a run."""

from __future__ import annotations

from raylm.config import EvalConfig
from raylm.evaluate import run_prompt, run_task_docs
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.requests.native import Tables, encode_task_requests


def build_task_requests(cfg: EvalConfig, encoder: Encoder | MaskedEncoder) -> tuple[Tables, dict[str, int]]:
    docs = run_task_docs(cfg)
    tables = encode_task_requests(docs, encoder, run_prompt(cfg, encoder.tokenizer))
    return tables, {name: original for name, (_, original) in docs.items()}
