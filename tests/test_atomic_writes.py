"""A run killed while writing its samples leaves the previous files whole (or none), never a part of one."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.config import EvalConfig
from raylm.models.spec import ModelSpec
from raylm.results.report import EvalResult, TaskResult, write_samples

SCORED = pa.table({"doc_id": [0, 0, 1], "req_idx": [0, 1, 0], "loglikelihood": [-1.0, -2.0, -3.0]})


def result(table: pa.Table) -> EvalResult:
    cfg = EvalConfig(ModelSpec("m"), ("wikitext",))
    return EvalResult(cfg, {"wikitext": TaskResult("wikitext", "rolling", {}, {}, 2, table)}, 0.0)


def test_samples_written_over_are_the_old_file_or_the_new_never_a_part(tmp_path, monkeypatch):
    write_samples(tmp_path, result(SCORED))
    path = tmp_path / "samples" / "wikitext.parquet"
    real_write = pq.write_table

    def killed_midway(table, where, **kwargs):
        real_write(table.slice(0, 1), where, **kwargs)  # some bytes reach the file, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", killed_midway)
    with pytest.raises(OSError, match="No space left"):
        write_samples(tmp_path, result(SCORED.slice(1)))
    monkeypatch.undo()
    assert pq.read_table(path).select(SCORED.column_names).equals(SCORED)
    assert [p.name for p in path.parent.iterdir()] == ["wikitext.parquet"]  # no partial file left beside it
