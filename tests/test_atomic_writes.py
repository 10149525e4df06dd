"""A run killed while writing its samples leaves the previous files whole (or none), never a part of one."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.config import EvalConfig
from raylm.models.spec import ModelSpec
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.report import write_samples

pytest_plugins = ["faulty_fs"]  # its fixture: faulty

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


@pytest.mark.parametrize("partial", [None, ".stream.partial"])
def test_a_written_file_has_the_permissions_the_umask_gives_any_new_file(tmp_path, partial):
    """Results on a shared disk are read by others (a team's dashboard, the next job's user): an atomic write must
    not leave them owner-only."""
    from raylm.storage.atomic import open_atomic

    old = os.umask(0o002)  # a group-shared umask
    try:
        with open_atomic(tmp_path / "results.json", partial) as f:
            f.write(b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o664


def test_a_write_failing_midway_on_a_filesystem_without_rename_leaves_no_file(faulty):
    """fsspec's filesystems (sftp, ftp, here its in-memory one) show a file under its name from the moment it is
    opened: a write there goes to another name first, so the 2nd of 3 chunks failing leaves nothing at the name."""
    from raylm.storage.atomic import write_atomic
    from raylm.storage.location import location

    out = location("faulty://run")
    write_atomic(out / "old.json", b"{}")
    faulty.fail_write_at = 3  # old.json's one write, then the new file's first chunk, then its second
    with pytest.raises(OSError, match="No space left"):
        write_atomic(out / "samples.parquet", b"x" * (3 << 20))
    assert [p.name for p in out.iterdir()] == ["old.json"]
