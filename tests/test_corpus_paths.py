"""Corpus paths: formats from extensions, globs expanded locally and through pyarrow filesystems (file://)."""

from __future__ import annotations

import pytest

from raylm.corpus.read import detect_format, expand_paths
from raylm.errors import InputError


def test_format_from_extension():
    assert detect_format("s3://bucket/shards/*.parquet") == "parquet"
    assert detect_format("data/train.JSONL") == "jsonl" and detect_format("a/b.json") == "jsonl"
    assert detect_format("wiki/test.txt") == "txt"
    assert detect_format("paloma/c4_en/val/val0.jsonl.gz") == "jsonl" and detect_format("x.json.gz") == "jsonl"
    with pytest.raises(InputError, match="corpus/: cannot tell the format .* pass --format"):
        detect_format("corpus/")


def test_globs_expand_to_sorted_files_locally_and_by_uri(tmp_path):
    for name in ("b-1.parquet", "a-0.parquet", "c.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d-2.parquet").write_text("x")
    assert expand_paths(str(tmp_path / "*.parquet")) == [str(tmp_path / "a-0.parquet"), str(tmp_path / "b-1.parquet")]
    assert expand_paths(str(tmp_path / "**" / "*.parquet")) == [
        str(tmp_path / "a-0.parquet"), str(tmp_path / "b-1.parquet"), str(tmp_path / "sub" / "d-2.parquet")]
    assert expand_paths(f"file://{tmp_path}/*-?.parquet") == [
        f"file://{tmp_path}/a-0.parquet", f"file://{tmp_path}/b-1.parquet"]
    assert expand_paths(str(tmp_path / "c.txt")) == [str(tmp_path / "c.txt")]
    with pytest.raises(InputError, match="no files match"):
        expand_paths(f"file://{tmp_path}/*.jsonl")
