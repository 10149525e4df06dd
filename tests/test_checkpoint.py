"""Checkpoint files on their own: resume the same run, refuse a different one, never trust a mismatched shard."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.cluster import checkpoint as checkpoint_module
from raylm.cluster.checkpoint import CHECKPOINT_DIR, MANIFEST, RAYLM_ROOT, Checkpoint, scored_with, source_digest
from raylm.config import EvalConfig
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.evaluate import run_fingerprint
from raylm.models.spec import ModelSpec
from raylm.cluster.scored import ScoredShard
from raylm.errors import RaylmError
from raylm.requests.shards import Shard
from raylm.storage.ownership import tagged
from raylm.scoring.sums import shard_sums

REQUESTS = pa.table({"doc_id": [0, 0, 1, 1], "req_idx": [0, 1, 0, 1], "gold": [1, 1, 0, 0], "norm_len": [3, 4, 5, 6]})
SHARDS = [Shard("hellaswag", "multiple_choice", 0, REQUESTS.slice(0, 2)),
          Shard("hellaswag", "multiple_choice", 1, REQUESTS.slice(2, 2))]
MANIFEST_A = {"limit": 2, "data": {"hellaswag": "abc"}, "code": {"raylm": "0.1.0"}}
RAYLM_RESULTS = {"results": {}, "config": {"versions": {"raylm": "0.1.0"}}}


def scored(shard: Shard, dtype: str = "float32") -> ScoredShard:
    table = shard.table.append_column("loglikelihood", pa.array([-1.5, -0.25][: shard.table.num_rows]))
    return ScoredShard(table, shard_sums(shard.kind, table), 1234, "packed (proven family: LlamaForCausalLM, sdpa)",
                       "cpu", dtype)


def test_saved_shards_come_back_identical(tmp_path):
    checkpoint = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False)
    checkpoint.save(SHARDS[1], scored(SHARDS[1]))
    again = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False).load(SHARDS)
    assert list(again) == [1]
    assert again[1].table.equals(scored(SHARDS[1]).table)
    assert again[1].sums == scored(SHARDS[1]).sums and again[1].pid == 1234
    assert again[1].prefix_sharing == scored(SHARDS[1]).prefix_sharing  # a resumed run still records the verdict
    assert (again[1].device, again[1].dtype) == ("cpu", "float32")
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


def test_shards_scored_on_another_device_or_dtype_are_not_resumed(tmp_path):
    """--device auto and --dtype auto resolve on the actor's node: the same command can score bfloat16 on a GPU one
    day and float32 on a CPU the next, and the two must not be merged."""
    checkpoint = Checkpoint.open(tmp_path, MANIFEST_A, overwrite=False)
    checkpoint.save(SHARDS[0], scored(SHARDS[0], dtype="bfloat16"))
    resumed = checkpoint.load(SHARDS)
    assert scored_with(resumed[0]) == "cpu/bfloat16"
    checkpoint.check_scored_with(resumed, "cpu/bfloat16")
    with pytest.raises(RaylmError, match=r"holds shards scored on cpu/bfloat16, and this run's actors score on "
                                         r"cuda/float32") as raised:
        checkpoint.check_scored_with(resumed, "cuda/float32")
    assert "\n" not in str(raised.value)


def test_a_library_upgrade_is_a_different_run(monkeypatch, tmp_path):
    """torch, transformers and lm-eval compute the scores and build the requests: resuming across an upgrade would
    merge shards of two versions."""
    cfg = EvalConfig(ModelSpec(str(DEMO_MODEL), device="cpu"), ("winogrande",), DEMO_DATA, limit=2, progress=False)
    before = run_fingerprint(cfg)
    assert set(before["versions"]) == {"torch", "transformers", "lm_eval"} and before["versions"]["torch"]
    Checkpoint.open(tmp_path, before, overwrite=False)
    real = checkpoint_module.metadata.version
    monkeypatch.setattr(checkpoint_module.metadata, "version",
                        lambda name: "99.0" if name == "transformers" else real(name))
    after = run_fingerprint(cfg)
    assert after["versions"]["transformers"] == "99.0"
    with pytest.raises(RaylmError, match=r"differs in: versions\)"):
        Checkpoint.open(tmp_path, after, overwrite=False)


SCALE_MODULE = '''"""Scales a score."""

SCALE = 2.0  # measured


class Scaler:
    """Holds nothing."""

    def scale(self, x: float) -> float:
        """x, scaled."""
        return x * SCALE
'''
SAME_CODE = {
    "a comment edited and added": SCALE_MODULE.replace("# measured", "# measured twice").replace(
        "        return", "        # why this scale\n        return"),
    "docstrings edited": SCALE_MODULE.replace("Scales a score.", "Scales a score;\nsee the docs.").replace(
        "Holds nothing.", "Holds no state.").replace("x, scaled.", "The score x times SCALE."),
}
OTHER_CODE = {
    "a constant": SCALE_MODULE.replace("2.0", "2.5"),
    "an expression": SCALE_MODULE.replace("x * SCALE", "x / SCALE"),
}


def source_tree(root, **modules: str):
    for name, text in {"__init__.py": "", **modules}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("edit", [*SAME_CODE, *OTHER_CODE, "a new module"])
def test_checkpoints_survive_comment_and_docstring_edits_and_no_code_change(tmp_path, edit):
    """A fix to a comment or docstring must not throw away a week of checkpoints (a sweep would supersede and rerun
    every finished point); a change to what the code computes must."""
    before = source_digest(source_tree(tmp_path / "before", **{"scoring/scale.py": SCALE_MODULE}))
    modules = {"scoring/scale.py": SAME_CODE.get(edit) or OTHER_CODE.get(edit) or SCALE_MODULE}
    if edit == "a new module":
        modules["scoring/offset.py"] = "OFFSET = 0\n"
    after = source_digest(source_tree(tmp_path / "after", **modules))
    assert (after == before) == (edit in SAME_CODE)


def test_source_digest_is_the_same_in_every_process():
    """The driver of a rerun is another process, hashing strings with another seed, and must find the same
    fingerprint."""
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    code = "from raylm.cluster.checkpoint import source_digest; print(source_digest())"
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == source_digest(RAYLM_ROOT)


def test_a_kept_source_digest_is_read_back_unparsed_and_an_edit_in_place_is_parsed_afresh(tmp_path, monkeypatch):
    """Parsing every module is a second of each run's start: an unchanged tree's digest comes from raylm's cache
    without a parse, while an edit in place (the same path, another ctime) is a miss."""
    root = source_tree(tmp_path / "code", **{"scoring/scale.py": SCALE_MODULE})
    monkeypatch.setenv("RAYLM_CACHE_DIR", str(tmp_path / "cache"))
    digest = source_digest.__wrapped__(root)
    parsed = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parsed.append(1) or real_parse(*a, **k))
    assert source_digest.__wrapped__(root) == digest and not parsed
    (root / "scoring" / "scale.py").write_text(OTHER_CODE["a constant"])
    assert source_digest.__wrapped__(root) != digest and parsed
