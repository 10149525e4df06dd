"""A run killed while writing its samples leaves the previous files whole (or none), never a part of one."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.config import EvalConfig
from raylm.errors import RaylmError
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
    faulty.fail_write_at = 5  # the rename probe's two files, old.json's one write, the new file's 1st chunk, its 2nd
    with pytest.raises(OSError, match="No space left"):
        write_atomic(out / "samples.parquet", b"x" * (3 << 20))
    assert [p.name for p in out.iterdir()] == ["old.json"]


@pytest.mark.parametrize("rename_over, why", [
    ("refuse", r"renaming a file onto another failed: \[Errno 17\] File exists: '.*-old'"),  # smb
    ("ignore", r"renaming a file onto another failed: renaming '.*' to '.*' reported success but left it in place"),
])
def test_a_filesystem_whose_rename_cannot_replace_a_file_is_refused_in_one_line_before_any_write(faulty, rename_over,
                                                                                                 why):
    """Replacing results.json, a checkpoint's manifest.json or the lock's lease there would fail every time (smb),
    or leave the old file and report success (webhdfs answering `false`): refused at the first write, the lock's."""
    from raylm.storage.atomic import write_atomic
    from raylm.storage.location import location

    faulty.rename_over = rename_over
    out = location(f"faulty://{rename_over}/run")
    with pytest.raises(RaylmError, match=rf"^output 'faulty://{rename_over}/run' is on a filesystem \(faulty\) that "
                                         rf"cannot replace a file in one step \({why}\), so a run killed while "
                                         r"replacing one \(a checkpoint's manifest.json\) would lose it; use a local "
                                         r"or NFS path or an object store \(s3://, gs://, abfs://\)$"):
        write_atomic(out / ".raylm.lock", b"{}")
    assert out.iterdir() == []  # the probe's files deleted, nothing written


def test_a_filesystem_known_to_delete_before_it_renames_is_refused_without_a_probe(faulty, monkeypatch):
    """pyarrow's HDFS client replaces a file by deleting it and then renaming: a kill in between loses the file, and
    no probe can see that (its result is right), so the filesystem is refused by name."""
    from raylm.storage import filesystems
    from raylm.storage.atomic import write_atomic
    from raylm.storage.location import location

    assert "deletes the existing file, then renames" in filesystems.NOT_ONE_STEP["hdfs"]
    monkeypatch.setitem(filesystems.NOT_ONE_STEP, "faulty", filesystems.NOT_ONE_STEP["hdfs"])
    with pytest.raises(RaylmError, match=r"^output 'faulty://hdfs-like' is on a filesystem \(faulty\) that cannot "
                                         r"replace a file in one step \(pyarrow's HDFS client deletes"):
        write_atomic(location("faulty://hdfs-like/results.json"), b"{}")
    assert next(faulty.moves) == 1 and location("faulty://hdfs-like").iterdir() == []


def test_renames_are_probed_once_per_output_and_one_that_silently_fails_fails_the_write(faulty):
    """A rename that replaces is probed once, by the first write under the output; a later rename that reports
    success and does nothing (webhdfs answering `false`) fails its write instead of leaving its temporary behind."""
    from raylm.storage.atomic import write_atomic
    from raylm.storage.location import location

    out = location("faulty://probed/run")
    write_atomic(out / "results.json", b"1")
    write_atomic(out / "checkpoint" / "manifest.json", b"2")
    write_atomic(out / "results.json", b"3")
    assert next(faulty.moves) == 1 + 3 + 1  # the probe's one rename, then one per write
    faulty.rename_over = "ignore"
    with pytest.raises(OSError, match=r"reported success but left it in place"):
        write_atomic(out / "results.json", b"4")
    assert (out / "results.json").read_bytes() == b"3"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "results.json"]
