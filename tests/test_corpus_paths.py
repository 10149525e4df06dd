"""Corpus paths: formats from extensions, globs expanded locally and through pyarrow filesystems (file://, s3://
on a real S3 API, tests/s3_server.py), each URI parsed once, its credentials and options reaching the read and
never the messages."""

from __future__ import annotations

import io
import json
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raylm.corpus.read import data_files, detect_format, expand_paths, read_corpus
from raylm.errors import InputError, RaylmError
from raylm.storage.atomic import write_atomic
from raylm.storage.location import has_wildcards, is_uri, location, split_query

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3

KEY, SECRET = "AKIDRAYLMCORPUS", "raylm+Corpus/Secret"  # moto takes any key; these are easy to find if they leak


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
    assert shown(str(tmp_path / "*.parquet")) == [str(tmp_path / "a-0.parquet"), str(tmp_path / "b-1.parquet")]
    assert shown(str(tmp_path / "**" / "*.parquet")) == [
        str(tmp_path / "a-0.parquet"), str(tmp_path / "b-1.parquet"), str(tmp_path / "sub" / "d-2.parquet")]
    assert shown(f"file://{tmp_path}/*-?.parquet") == [
        f"file://{tmp_path}/a-0.parquet", f"file://{tmp_path}/b-1.parquet"]
    assert shown(str(tmp_path / "c.txt")) == [str(tmp_path / "c.txt")]
    with pytest.raises(InputError, match="no files match"):
        expand_paths(f"file://{tmp_path}/*.jsonl")


def shown(data: str) -> list[str]:
    """The files a corpus path names, as messages show them."""
    return [str(p) for p in expand_paths(data)]


def put_parquet(bucket_uri: str, name: str, texts: list[str]) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    write_atomic(location(f"{bucket_uri}/{name}"), buf.getvalue())


def test_a_question_mark_starts_a_uri_query_only_before_a_name_and_equals(s3):
    """`?endpoint_override=` is a URI's options; `part-?.parquet`'s `?` a wildcard; a local path has no query."""
    options = "?endpoint_override=http://127.0.0.1:9000&region=us-east-1"
    assert split_query(f"s3://b/dir/part-?.parquet{options}") == ("s3://b/dir/part-?.parquet", options[1:])
    assert not has_wildcards(f"s3://b/dir/part-0.parquet{options}") and has_wildcards("s3://b/dir/part-?.parquet")
    assert has_wildcards("/data/shard-?.txt") and split_query("s3://b/what?.txt") == ("s3://b/what?.txt", "")
    assert detect_format(f"s3://b/dir/*.parquet{options}") == "parquet"
    with pytest.raises(RaylmError, match=r"^corpus 's3://\*\*\*@b\*/x.parquet': a wildcard must follow the bucket"):
        expand_paths("s3://K:S*@b*/x.parquet")
    assert is_uri("s3://b/x") and is_uri("file:///tmp/x") and not is_uri("data/s3://x") and not is_uri("/tmp/x")
    put_parquet(s3, "dir/part-0.parquet", ["a"])
    put_parquet(s3, "dir/part-1.parquet", ["b"])
    assert shown(f"{s3}/dir/part-0.parquet?region=us-east-1") == [f"{s3}/dir/part-0.parquet?region=us-east-1"]
    assert shown(f"{s3}/dir/part-?.parquet?region=us-east-1") == [
        f"{s3}/dir/part-{i}.parquet?region=us-east-1" for i in (0, 1)]


def test_a_corpus_uri_with_credentials_and_options_is_read_through_them_and_shown_without_the_secret(
        ray_session, s3, s3_server, monkeypatch):
    """The key and the endpoint are in the URI alone: the environment names neither, so a read that lost them
    (a path rebuilt as `s3://bucket/...`) would reach no store."""
    bucket = s3[len("s3://"):]
    put_parquet(s3, "mix/a.parquet", ["first doc", "second doc"])
    put_parquet(s3, "mix/b.parquet", ["third doc"])
    put_parquet(s3, "mix/sub/c.parquet", ["not at the glob's depth"])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    options = f"?endpoint_override={s3_server}"
    uri = f"s3://{KEY}:{quote(SECRET, safe='')}@{bucket}/mix/*.parquet{options}"
    assert shown(uri) == [f"s3://***@{bucket}/mix/{name}.parquet{options}" for name in ("a", "b")]
    assert [f["path"] for f in data_files(uri)] == [f"{bucket}/mix/a.parquet", f"{bucket}/mix/b.parquet"]
    rows = read_corpus(uri).take_all()
    assert [r["text"] for r in rows] == ["first doc", "second doc", "third doc"]
    assert [r["path"] for r in rows] == [f"{bucket}/mix/a.parquet"] * 2 + [f"{bucket}/mix/b.parquet"]
    with pytest.raises(InputError) as raised:
        read_corpus(uri.replace("*.parquet", "*.jsonl"))
    message = str(raised.value)
    assert message == f"s3://***@{bucket}/mix/*.jsonl{options}: no files match"
    assert not any(s in message + json.dumps(rows) for s in (KEY, SECRET, quote(SECRET, safe="")))


def test_the_paths_of_one_corpus_open_on_one_filesystem(s3, tmp_path):
    """Ray Data reads a corpus through one filesystem: paths on two are refused in one line, before any read."""
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    write_atomic(location(f"{s3}/b.jsonl"), b'{"text": "y"}\n')
    with pytest.raises(InputError, match=r": the paths are on different filesystems .* read one at a time$"):
        read_corpus([str(tmp_path / "a.jsonl"), f"{s3}/b.jsonl"])
