"""Checkpoint files on their own: resume the same run, refuse a different one, never trust a mismatched shard."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.cluster.checkpoint import CHECKPOINT_DIR, MANIFEST, Checkpoint
from raylm.cluster.scored import ScoredShard
from raylm.errors import RaylmError
from raylm.requests.shards import Shard
from raylm.results.ownership import tagged
from raylm.results.sums import shard_sums

REQUESTS = pa.table({"doc_id": [0, 0, 1, 1], "req_idx": [0, 1, 0, 1], "gold": [1, 1, 0, 0], "norm_len": [3, 4, 5, 6]})
SHARDS = [Shard("hellaswag", "multiple_choice", 0, REQUESTS.slice(0, 2)),
          Shard("hellaswag", "multiple_choice", 1, REQUESTS.slice(2, 2))]
MANIFEST_A = {"limit": 2, "data": {"hellaswag": "abc"}, "code": {"raylm": "0.1.0"}}
RAYLM_RESULTS = {"results": {}, "config": {"versions": {"raylm": "0.1.0"}}}


def scored(shard: Shard) -> ScoredShard:
    table = shard.table.append_column("loglikelihood", pa.array([-1.5, -0.25][: shard.table.num_rows]))
    return ScoredShard(table, shard_sums(shard.kind, table), 1234, "packed (proven family: LlamaForCausalLM, sdpa)")


def test_saved_shards_come_back_identical(tmp_path):
    checkpoint = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False)
    checkpoint.save(SHARDS[1], scored(SHARDS[1]))
    again = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False).load(SHARDS)
    assert list(again) == [1]
    assert again[1].table.equals(scored(SHARDS[1]).table)
    assert again[1].sums == scored(SHARDS[1]).sums and again[1].pid == 1234
    assert again[1].prefix_sharing == scored(SHARDS[1]).prefix_sharing  # a resumed run still records the verdict
    assert not list((tmp_path / CHECKPOINT_DIR / "shards").glob(".*"))  # no temp files left behind


def test_shard_file_with_other_requests_is_scored_again(tmp_path):
    checkpoint = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False)
    checkpoint.save(SHARDS[0], scored(SHARDS[1]))
    (tmp_path / CHECKPOINT_DIR / "shards" / "000001.parquet").write_bytes(b"truncated")
    assert checkpoint.load(SHARDS) == {}


@pytest.mark.parametrize("leftover", ["manifest", "results only"])
def test_different_run_is_refused_and_overwrite_discards_only_raylm_files(tmp_path, leftover):
    if leftover == "manifest":
        Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False).save(SHARDS[0], scored(SHARDS[0]))
        expected = "differs in: limit"
    else:
        (tmp_path / "results.json").write_text(json.dumps(RAYLM_RESULTS))
        expected = "differs in: results.json without a checkpoint"
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "samples").mkdir()
    pq.write_table(tagged(REQUESTS), tmp_path / "samples" / "hellaswag.parquet")
    other = {**MANIFEST_A, "limit": 3}
    with pytest.raises(RaylmError, match=f"holds results of a different run \\({expected}\\)"):
        Checkpoint.open(tmp_path, other, overwrite=False)
    checkpoint = Checkpoint.open(tmp_path, other, overwrite=True)
    assert checkpoint.load(SHARDS) == {} and not (tmp_path / "results.json").exists()
    assert json.loads((tmp_path / CHECKPOINT_DIR / MANIFEST).read_text()) == other
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "samples").exists()


def test_overwrite_deletes_nothing_raylm_did_not_write(tmp_path):
    """A training run's checkpoint/, someone's results.json, a Parquet file of one's own among raylm's samples."""
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "step-100.pt").write_bytes(b"weights")
    (tmp_path / "samples").mkdir()
    pq.write_table(REQUESTS, tmp_path / "samples" / "mine.parquet")
    pq.write_table(tagged(REQUESTS), tmp_path / "samples" / "hellaswag.parquet")
    for overwrite in (False, True):
        with pytest.raises(RaylmError, match="checkpoint' holds files raylm did not write"):
            Checkpoint.open(tmp_path, MANIFEST_A, overwrite=overwrite)
    assert (tmp_path / "checkpoint" / "step-100.pt").read_bytes() == b"weights"
    (tmp_path / "checkpoint" / "step-100.pt").unlink()
    (tmp_path / "results.json").write_text('{"accuracy": 0.9}')
    with pytest.raises(RaylmError, match="results.json' was not written by raylm"):
        Checkpoint.open(tmp_path, MANIFEST_A, overwrite=True)
    assert (tmp_path / "results.json").read_text() == '{"accuracy": 0.9}'
    (tmp_path / "results.json").unlink()
    Checkpoint.open(tmp_path, MANIFEST_A, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["mine.parquet"]


def test_unwritable_checkpoint_is_a_one_line_error(tmp_path):
    checkpoint = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False)
    (tmp_path / CHECKPOINT_DIR / "shards").write_text("a file where the shards directory belongs")
    with pytest.raises(RaylmError, match="cannot write checkpoint .*000000.parquet: "):
        checkpoint.save(SHARDS[0], scored(SHARDS[0]))
