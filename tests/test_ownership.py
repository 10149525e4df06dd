"""One rule decides what in an output directory a command may replace (raylm.storage.ownership): its own
results, never another command's, never a file raylm did not write; every command that writes checks it the same
way, before any work."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.cluster.checkpoint import Checkpoint
from raylm.contamination import membership_run, report
from raylm.errors import RaylmError
from raylm.results.sample_logs import date_id, sample_log_name
from raylm.storage.atomic import write_atomic, write_parquet_atomic
from raylm.storage.location import location
from raylm.storage import ownership
from raylm.storage.ownership import check_results_owner, tagged

pytest_plugins = ["faulty_fs"]  # its fixture: faulty

MANIFEST = {"code": {"raylm": "0.1.0"}}

# command -> (what it checks before any work, its JSON file, the Parquet files it writes at fixed names)
COMMANDS: dict[str, tuple[Callable[[Path], object], str, tuple[str, ...]]] = {
    "eval": (lambda out: Checkpoint.open(out, MANIFEST, overwrite=True), "results.json", ()),
    "ppl": (lambda out: check_results_owner(out, "ppl"), "results.json", ()),
    "contamination": (report.check_output, "contamination.json", ("matches.parquet",)),
    "membership": (membership_run.check_output, "membership.json", ("membership.parquet",)),
}


def written_by(command: str) -> str:
    config = {"versions": {"raylm": "0.1.0"}, **({"command": command} if command != "eval" else {})}
    return json.dumps({"results": {}, "config": config})


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_replaces_its_own_results(command, tmp_path):
    check, results, parquets = COMMANDS[command]
    (tmp_path / results).write_text(written_by(command))
    for name in parquets:
        pq.write_table(tagged(pa.table({"x": [1]})), tmp_path / name)
    check(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
def test_another_commands_results_stay(command, tmp_path):
    """`raylm eval --overwrite` too: it discards its own results, not a `raylm ppl` run's in the same directory."""
    check, results, _ = COMMANDS[command]
    other = {"eval": "ppl", "ppl": "eval", "contamination": "membership", "membership": "contamination"}[command]
    (tmp_path / results).write_text(written_by(other))
    with pytest.raises(RaylmError, match=f"'{tmp_path / results}' holds the results of `raylm {other}`; use "
                                         "another --output$"):
        check(tmp_path)
    assert (tmp_path / results).read_text() == written_by(other)


@pytest.mark.parametrize("command", COMMANDS)
def test_files_raylm_did_not_write_stay(command, tmp_path):
    check, results, parquets = COMMANDS[command]
    for name in (results, *parquets):
        path = tmp_path / name
        if name.endswith(".parquet"):
            pq.write_table(pa.table({"x": [1]}), path)
        else:
            path.write_text('{"mine": true}')
        with pytest.raises(RaylmError, match=f"'{path}' was not written by raylm; use another --output$"):
            check(tmp_path)
        assert path.exists()
        path.unlink()


def test_overwrite_removes_the_previous_runs_sample_logs_and_only_those(tmp_path):
    """lm-eval's samples_<task>_<date>.jsonl carry a new date each run: --overwrite deletes the previous run's,
    those of a task whose Parquet samples raylm wrote, and leaves a jsonl of the user's."""
    samples = tmp_path / "samples"
    samples.mkdir()
    pq.write_table(tagged(pa.table({"x": [1]})), samples / "arc_easy.parquet")
    previous = samples / sample_log_name("arc_easy", date_id())
    theirs = samples / sample_log_name("hellaswag", date_id())
    for path in (previous, theirs):
        path.write_text("{}\n")
    Checkpoint.open(tmp_path, MANIFEST, overwrite=True)
    assert sorted(p.name for p in samples.iterdir()) == [theirs.name]


def test_a_sweep_point_moved_aside_and_cut_short_is_one_the_next_sweep_accepts(faulty):
    """On a filesystem without directories a point moves file by file; a move cut short must not leave shards
    without the manifest that says whose they are (the next sweep would refuse the point as not raylm's)."""
    point = location("faulty://sweep/model/point")
    write_atomic(point / "results.json", written_by("eval").encode())
    write_atomic(point / "checkpoint" / "manifest.json", json.dumps(MANIFEST).encode())
    for index in range(2):
        write_parquet_atomic(point / "checkpoint" / "shards" / f"{index:06d}.parquet", tagged(pa.table({"x": [1]})))
    faulty.moves, faulty.fail_move_at = itertools.count(1), 2
    with pytest.raises(OSError, match="Connection reset"):
        point.move(location("faulty://sweep/superseded/then/model/point"))
    Checkpoint(point, {**MANIFEST, "data": "another config"}).refuse_foreign()


def test_overwrite_removes_what_a_stage_registered_as_its_own(tmp_path, monkeypatch):
    """The ground floor knows no stage's layout: a stage registers the folder of its checkpoint parts and how a file
    it cannot mark names the Parquet file that proves it raylm's; --overwrite removes those, and nothing else."""
    monkeypatch.setattr(ownership, "_CHECKPOINT_PARTS", set(ownership._CHECKPOINT_PARTS))
    monkeypatch.setattr(ownership, "_COMPANIONS", list(ownership._COMPANIONS))
    ownership.own_checkpoint_parts("extra")
    ownership.own_companions(lambda name: name.removesuffix(".log") + ".parquet" if name.endswith(".log") else None)
    write_atomic(tmp_path / "checkpoint" / "manifest.json", json.dumps(MANIFEST).encode())
    write_parquet_atomic(tmp_path / "checkpoint" / "extra" / "0.parquet", tagged(pa.table({"x": [1]})))
    samples = tmp_path / "samples"
    write_parquet_atomic(samples / "task.parquet", tagged(pa.table({"x": [1]})))
    for name in ("task.log", "other.log"):
        (samples / name).write_text("{}\n")
    Checkpoint.open(tmp_path, MANIFEST, overwrite=True)
    assert not (tmp_path / "checkpoint" / "extra").exists()
    assert sorted(p.name for p in samples.iterdir()) == ["other.log"]
