"""Outputs on an object store: every writing command round-trips through a real S3 API on localhost (moto's
server, tests/s3_server.py), the lock holds there as a lease, and --overwrite and ownership hold as on a disk."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import DATA, run_cli
from test_probe import PROBES

import raylm
from raylm.cli import main
from raylm.cli.options import output_arg
from raylm.cluster.checkpoint import Checkpoint
from raylm.corpus.stream import PartialParquet
from raylm.errors import RaylmError
from raylm.storage import filesystems, lock
from raylm.storage.atomic import fence, open_atomic, write_atomic, write_parquet_atomic
from raylm.storage.location import Location, location, prepare_output
from raylm.storage.lock import LOCK_FILE, output_lock
from raylm.storage.ownership import check_results_owner, is_raylm_parquet, tagged
from raylm.tasks.queries import native_queries

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3


@pytest.fixture(autouse=True)
def quick_settle(monkeypatch):
    """The lease's read-back wait, shortened: moto answers in milliseconds."""
    monkeypatch.setattr(lock, "SETTLE_S", 0.05)


def test_an_s3_uri_is_a_location_on_s3_never_a_local_folder(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output_arg(f"{s3}/run") == f"{s3}/run"  # a Path would fold `s3://` into `s3:/`
    out = prepare_output(output_arg(f"{s3}/run"))
    assert isinstance(out.fs, pafs.S3FileSystem) and out.path == f"{s3[5:]}/run" and str(out) == f"{s3}/run"
    write_atomic(out / "a" / "b.json", b"{}")
    assert (out / "a" / "b.json").read_bytes() == b"{}" and [p.name for p in (out / "a").iterdir()] == ["b.json"]
    assert list(tmp_path.iterdir()) == []


KEY, SECRET = "AKIDRAYLMTEST", "raylm+Secret/Key"  # an AWS secret may hold '/' and '+', escaped in a URI


def with_credentials(uri: str) -> str:
    """s3://bucket/... with the key and secret in it, as pyarrow takes them."""
    return uri.replace("s3://", f"s3://{KEY}:{quote(SECRET, safe='')}@", 1)


def test_credentials_in_a_uri_reach_the_store_and_nothing_else(s3, monkeypatch):
    """One parser, endpoint or not: the store gets the key, every message and the lock get `***`."""
    bucket = s3[len("s3://"):]
    uri = with_credentials(f"{s3}/run")
    monkeypatch.setattr(sys, "argv", ["raylm", "eval", "--output", uri])
    out = prepare_output(uri)
    assert str(out) == f"s3://***@{bucket}/run" and out.path == f"{bucket}/run"
    with output_lock(out):
        held = (out / LOCK_FILE).read_text()
        refused = refusal(out)
    assert json.loads(held)["command"] == f"raylm eval --output s3://***@{bucket}/run"
    assert f"'s3://***@{bucket}/run' is in use" in refused and KEY not in refused + held
    with_region = prepare_output(f"{uri}?region=us-east-1")  # a query option keeps AWS_ENDPOINT_URL's endpoint
    write_atomic(with_region / "x.json", b"{}")
    assert str(with_region) == f"s3://***@{bucket}/run?region=us-east-1" and (out / "x.json").read_bytes() == b"{}"
    for bad in (f"s3://{KEY}:{SECRET}@{bucket}/run", f"s3://{KEY}:{quote(SECRET, safe='')}@{bucket}/run?bogus=1"):
        with pytest.raises(RaylmError) as raised:
            location(bad)
        assert str(raised.value).startswith("cannot open output 's3://***@") and KEY not in str(raised.value)
        assert SECRET not in str(raised.value) and quote(SECRET, safe="") not in str(raised.value)


def test_a_uri_a_path_folded_is_refused_not_made_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RaylmError, match=r"looks like a storage URI whose '//' was folded.*'s3://evals/run'"):
        prepare_output(Path("s3://evals/run"))
    assert list(tmp_path.iterdir()) == []


def test_a_bucket_that_does_not_exist_is_one_line_before_any_work(s3):
    with pytest.raises(RaylmError, match=r"output directory 's3://no-such-bucket-here/run' is not writable"):
        prepare_output("s3://no-such-bucket-here/run")


def test_a_write_that_fails_leaves_the_previous_object_or_none(s3):
    """Nothing reaches the store before the whole file is written: a run killed or failing mid-write leaves the old
    object (results.json) or none (a Parquet stream, as ppl and contamination write theirs)."""
    out = location(f"{s3}/run")
    write_atomic(out / "results.json", b"old")
    with pytest.raises(ZeroDivisionError), open_atomic(out / "results.json") as f:
        f.write(b"new, half written")
        1 / 0
    with pytest.raises(ZeroDivisionError), PartialParquet(out / "samples.parquet", pa.schema([("x", pa.int64())])) as p:
        p.write(pa.table({"x": [1]}))
        1 / 0
    assert (out / "results.json").read_bytes() == b"old" and [p.name for p in out.iterdir()] == ["results.json"]


def test_an_upload_interrupted_midway_leaves_no_object(s3, monkeypatch):
    """Ctrl-C between two chunks of an upload: pyarrow's stream still completes what it sent when it closes, so
    the upload goes to another name, deleted here; the final name never holds a part."""
    real_copy = shutil.copyfileobj

    def interrupted(src, dst, length=0):
        dst.write(src.read(length))
        raise KeyboardInterrupt

    out = location(f"{s3}/run")
    monkeypatch.setattr(shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(out / "samples.parquet", b"x" * (3 << 20))
    monkeypatch.setattr(shutil, "copyfileobj", real_copy)
    assert out.iterdir() == []


def test_a_file_above_the_s3_copy_limit_is_uploaded_under_its_own_name_whole(s3, monkeypatch):
    """One CopyObject takes at most 5 GB (a large samples/ppl.parquet is more): above the limit, patched down here,
    the file is uploaded straight to its name, which S3 shows only once the upload completes; no temporary is
    uploaded beside it. Below it, the temporary is there when the file is about to be put in place."""
    monkeypatch.setattr(filesystems, "S3_COPY_LIMIT", 1 << 20)
    out = location(f"{s3}/run")
    beside = []
    unfence = fence(out, lambda: beside.append(sorted(p.name for p in out.iterdir())))
    try:
        data = os.urandom(3 << 20)
        write_atomic(out / "ppl.parquet", data)
        write_atomic(out / "results.json", b"{}")
    finally:
        unfence()
    assert (out / "ppl.parquet").read_bytes() == data and (out / "results.json").read_bytes() == b"{}"
    assert beside[0] == [] and len(beside[1]) == 2 and beside[1][0].startswith(".results.json.")
    assert sorted(p.name for p in out.iterdir()) == ["ppl.parquet", "results.json"]


def test_a_temporary_left_after_a_good_copy_is_a_warning_not_a_failed_write(s3, monkeypatch, caplog):
    """The file is in place once the copy succeeded: a store refusing to delete the upload beside it (a policy
    without DeleteObject, a dropped connection) leaves litter, named in a warning, and the write stands."""
    real_unlink = Location.unlink

    def refused(self):
        if self.name.startswith(".results.json."):
            raise OSError("AccessDenied: not allowed to delete")
        real_unlink(self)

    out = location(f"{s3}/run")
    monkeypatch.setattr(Location, "unlink", refused)
    with caplog.at_level(logging.WARNING):
        write_atomic(out / "results.json", b"{}")
    assert (out / "results.json").read_bytes() == b"{}"
    assert f"could not delete the temporary file {s3}/run/.results.json." in caplog.text
    assert f"after putting {s3}/run/results.json in place: AccessDenied" in caplog.text


def test_a_scheme_pyarrow_lacks_goes_through_fsspec():
    out = location("memory://raylm-test/run")
    assert isinstance(out.fs, pafs.PyFileSystem)
    write_parquet_atomic(out / "t.parquet", tagged(pa.table({"x": [1, 2]})))
    assert is_raylm_parquet(out / "t.parquet")


def refusal(out) -> str | None:
    """What a second run taking the lock meanwhile is told (another thread is refused like another process)."""
    said = []

    def second() -> None:
        try:
            with output_lock(out):
                said.append(None)
        except RaylmError as e:
            said.append(str(e))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    return said[0]


def test_a_live_lease_refuses_a_second_run_and_a_released_one_is_gone(s3):
    out = location(f"{s3}/run")
    with output_lock(out):
        held = json.loads((out / LOCK_FILE).read_bytes())
        refused = refusal(out)
    assert held["pid"] > 0 and held["expires"] > time.time() and held["owner"]
    assert refused.startswith(f"output directory '{s3}/run' is in use by another raylm run (pid {held['pid']} on ")
    assert "lease until" in refused and "or for its lease to expire (in " in refused and "\n" not in refused
    assert not (out / LOCK_FILE).exists()
    assert refusal(out) is None


def test_the_holder_renews_its_lease(s3, monkeypatch):
    """A one-second lease held for two: renewed, so a second run is still refused."""
    monkeypatch.setenv(lock.LEASE_ENV, "1")
    out = location(f"{s3}/run")
    with output_lock(out):
        first = json.loads((out / LOCK_FILE).read_bytes())["expires"]
        time.sleep(2)
        renewed = json.loads((out / LOCK_FILE).read_bytes())["expires"]
        assert renewed > first + 1 and refusal(out) is not None


def test_an_expired_lease_is_taken_over_with_a_warning(s3, caplog):
    out = location(f"{s3}/run")
    dead = {"pid": 4242, "host": "gone-node", "command": "raylm eval", "since": "then", "owner": "x",
            "expires": time.time() - 1}
    write_atomic(out / LOCK_FILE, json.dumps(dead).encode())
    with caplog.at_level(logging.WARNING), output_lock(out):
        assert json.loads((out / LOCK_FILE).read_bytes())["pid"] != 4242
    assert "whose lease expired (pid 4242 on gone-node, `raylm eval`" in caplog.text
    assert not (out / LOCK_FILE).exists()


def test_a_dead_holder_of_this_host_is_taken_over_at_once(s3, caplog):
    """Its lease has a minute to run, but its process is gone: same host, same boot and pid namespace, pid dead."""
    out = location(f"{s3}/run")
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = {**lock._me(), "pid": dead.pid, "owner": "x", "expires": time.time() + 60}
    write_atomic(out / LOCK_FILE, json.dumps(holder).encode())
    with caplog.at_level(logging.WARNING), output_lock(out):
        assert json.loads((out / LOCK_FILE).read_bytes())["pid"] == os.getpid()
    assert f"held by a run of this host that is no longer running (pid {dead.pid} on " in caplog.text


def test_a_lock_record_that_is_no_lease_is_never_taken_for_an_expired_one(s3):
    out = location(f"{s3}/run")
    write_atomic(out / LOCK_FILE, b'{"pid": 4242, "host": "node-1", "exp')
    with pytest.raises(RaylmError, match=rf"^'{s3}/run/{LOCK_FILE}' is not a raylm lock \(no lease in it\); if no "
                                         rf"run uses '{s3}/run', delete it$"):
        with output_lock(out):
            pass
    assert (out / LOCK_FILE).read_bytes().endswith(b'"exp')


def test_a_run_whose_lease_was_taken_over_stops_writing(s3, monkeypatch):
    """Another run took the lease (this one stalled past it): the holder's renewal finds it, and every later write
    of the holder under its output fails, in one line."""
    monkeypatch.setenv(lock.LEASE_ENV, "1")
    out = location(f"{s3}/run")
    other = {"pid": 4242, "host": "node-2", "command": "raylm eval", "since": "now", "owner": "x",
             "expires": time.time() + 60}
    with pytest.raises(RaylmError) as stopped, output_lock(out):
        write_atomic(out / LOCK_FILE, json.dumps(other).encode())
        for _ in range(100):  # renewals come every third of a second
            write_atomic(out / "results.json", b"{}")
            time.sleep(0.1)
    assert str(stopped.value).startswith(f"output directory '{s3}/run': this run's lease was taken over by another "
                                         "raylm run (pid 4242 on node-2, `raylm eval`")
    assert str(stopped.value).endswith("; this run stopped writing there")
    assert json.loads((out / LOCK_FILE).read_bytes())["owner"] == "x"  # the new holder's lease stays


def test_a_holder_whose_renewal_hangs_past_its_lease_stops_writing(s3, monkeypatch):
    """The renewer stuck in a read the store does not answer: once the lease it could not renew has expired, another
    run may hold it, so the holder's writes stop then, not only once the stuck read returns."""
    monkeypatch.setenv(lock.LEASE_ENV, "1")
    out = location(f"{s3}/run")
    answer = threading.Event()
    real_read = lock._Lease._read

    def stuck(self):
        if threading.current_thread().name == "raylm-lease":
            answer.wait()
        return real_read(self)

    monkeypatch.setattr(lock._Lease, "_read", stuck)
    with pytest.raises(RaylmError) as stopped, output_lock(out):
        expires = json.loads((out / LOCK_FILE).read_bytes())["expires"]
        while time.time() <= expires:
            time.sleep(0.05)
        try:
            write_atomic(out / "results.json", b"{}")
        finally:
            answer.set()
    assert str(stopped.value) == (f"output directory '{s3}/run': this run's lease expired before it could renew it; "
                                  "this run stopped writing there")
    assert not (out / "results.json").exists()


def test_ownership_and_overwrite_on_s3(s3):
    """A results.json raylm did not write is refused; --overwrite deletes raylm's files there and nothing else."""
    out = location(f"{s3}/run")
    write_atomic(out / "results.json", b'{"mine": true}')
    with pytest.raises(RaylmError, match=rf"'{s3}/run/results.json' was not written by raylm; use another --output"):
        check_results_owner(out, "eval")
    manifest = {"code": {"raylm": raylm.__version__}, "data": 1}
    (out / "results.json").unlink()
    Checkpoint.open(out, manifest, overwrite=False)
    write_parquet_atomic(out / "checkpoint" / "shards" / "000000.parquet", tagged(pa.table({"x": [1]})))
    write_atomic(out / "checkpoint" / "notes.txt", b"the user's")
    with pytest.raises(RaylmError, match=r"holds results of a different run \(differs in: data\)"):
        Checkpoint.open(out, {**manifest, "data": 2}, overwrite=False)
    Checkpoint.open(out, {**manifest, "data": 2}, overwrite=True)
    left = sorted(p.path[len(out.path):] for p in out.files())
    assert left == ["/checkpoint/manifest.json", "/checkpoint/notes.txt"]
    assert json.loads((out / "checkpoint" / "manifest.json").read_bytes())["data"] == 2


# Every command that writes, to s3:// and back: what it printed is what the store holds.

def read_json(uri: str) -> dict:
    return json.loads(location(uri).read_bytes())


def read_parquet(uri: str) -> pa.Table:
    with location(uri).open_input() as f:
        return pq.read_table(f)


def printed_values(text: str, label: str) -> dict[str, float]:
    """`<label> <key> <value>` lines, as ppl and kl print their metrics."""
    return {line.split()[1]: float(line.split()[2]) for line in text.splitlines() if line.startswith(f"{label} ")}


def test_eval_writes_results_samples_and_checkpoint_to_s3(ray_session, tiny_llama, s3, tmp_path, monkeypatch,
                                                         capsys, caplog):
    """With the credentials in the URI: what the run printed, logged and stored shows them as `***`."""
    monkeypatch.chdir(tmp_path)
    out = f"{s3}/eval"
    with caplog.at_level(logging.INFO):
        assert main(["eval", "--model", str(tiny_llama), "--tasks", "winogrande", "--data-dir", str(DATA), "--limit",
                     "3", "--shard-size", "4", "--output", with_credentials(out), "--log-samples",
                     "--no-progress"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert f"results written to s3://***@{out[len('s3://'):]}/results.json" in printed
    stored = b"".join(p.read_bytes() for p in location(out).files())
    assert all(KEY not in text for text in (printed, captured.err, caplog.text, stored.decode(errors="replace")))
    results = read_json(f"{out}/results.json")
    acc = results["results"]["winogrande"]["acc,none"]
    assert any(line.startswith("|winogrande") and f"{acc:.4f}" in line for line in printed.splitlines())
    assert read_parquet(f"{out}/samples/winogrande.parquet").num_rows == 6  # two choices per document
    manifest = read_json(f"{out}/checkpoint/manifest.json")
    shards = [p.name for p in location(f"{out}/checkpoint/shards").iterdir()]
    assert len(shards) == len(manifest["shards"]) == 2 and not (location(out) / LOCK_FILE).exists()
    assert list(tmp_path.iterdir()) == []  # no local `s3:` folder


def test_ppl_and_kl_write_to_s3(ray_session, tiny_llama, s3, tmp_path, capsys):
    data = tmp_path / "corpus.jsonl"
    lines = [line for line in (DATA / "wikitext-2" / "valid.txt").read_text().splitlines() if line.strip()][:4]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    for command, extra, docs in (("ppl", ["--limit-docs", "3"], 3), ("kl", ["--model-b", str(tiny_llama)], 4)):
        out = f"{s3}/{command}"
        assert main([command, "--model", str(tiny_llama), *extra, "--data", str(data), "--max-length", "32",
                     "--actors", "1", "--output", out, "--no-progress"]) == 0
        printed = capsys.readouterr().out
        stored = read_json(f"{out}/results.json")["results"][command]
        shown = printed_values(printed, command)
        assert shown and shown == pytest.approx({k: stored[k] for k in shown}, rel=1e-5)
        assert read_parquet(f"{out}/samples/{command}.parquet").num_rows == docs == stored["docs"]
        assert f"results written to {out}/results.json" in printed


@pytest.mark.slow  # a Ray of its own
def test_ppl_reads_a_corpus_uri_with_credentials_and_shows_them_nowhere(tiny_llama, s3, s3_server, tmp_path,
                                                                        monkeypatch, capsys):
    """The corpus's key and endpoint in its URI alone (the environment names neither): the command reads the files,
    and what it prints and stores shows the URI as `s3://***@...`, a glob that matches nothing included."""
    bucket = s3[len("s3://"):]
    texts = ["a tiny first document", "the second one", "and a third"]
    for name, part in (("a", texts[:2]), ("b", texts[2:])):
        write_atomic(location(f"{s3}/mix/{name}.jsonl"), "".join(json.dumps({"text": t}) + "\n" for t in part).encode())
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    options = f"?endpoint_override={s3_server}"
    corpus, out = with_credentials(f"{s3}/mix/*.jsonl") + options, tmp_path / "out"
    ran = run_cli("ppl", "--model", str(tiny_llama), "--data", corpus, "--max-length", "32", "--actors", "1",
                  "--output", str(out), "--no-progress")
    assert ran.returncode == 0, ran.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["data"] == f"s3://***@{bucket}/mix/*.jsonl{options}"
    assert results["results"]["ppl"]["docs"] == 3
    samples = pq.read_table(out / "samples" / "ppl.parquet")
    assert samples["path"].to_pylist() == [f"{bucket}/mix/a.jsonl"] * 2 + [f"{bucket}/mix/b.jsonl"]
    assert main(["ppl", "--model", str(tiny_llama), "--data", corpus.replace("*.jsonl", "*.parquet"),
                 "--output", str(tmp_path / "missing"), "--no-progress"]) == 2
    missing = capsys.readouterr()
    assert missing.err.strip().splitlines()[-1] == (
        f"raylm: error: s3://***@{bucket}/mix/*.parquet{options}: no files match")
    stored = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file()).decode(errors="replace")
    for text in (ran.stdout, ran.stderr, missing.out, missing.err, stored):
        assert KEY not in text and SECRET not in text and quote(SECRET, safe="") not in text


def test_probe_writes_to_s3(tiny_bert, s3, tmp_path, capsys):
    path, out = tmp_path / "probes.yaml", f"{s3}/probe"
    path.write_text(PROBES)
    assert main(["probe", "--model", str(tiny_bert), "--probes", str(path), "--output", out, "--top-k", "2",
                 "--dtype", "float32", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert location(f"{out}/summary.md").read_text() in printed
    summary = read_json(f"{out}/results.json")["summary"]
    assert len(summary) == 6 and location(f"{out}/probe.png").read_bytes()[:4] == b"\x89PNG"
    assert len(location(f"{out}/probe.csv").read_text().splitlines()) == 1 + 6 * 3


def test_contamination_and_membership_write_to_s3(ray_session, tiny_llama, s3, tmp_path, capsys):
    """The corpus on S3 too, its credentials in its URI: contamination.json records it as `s3://***@...`."""
    query = native_queries("winogrande", DATA)[0]
    corpus = f"{s3}/corpus/part-0.jsonl"
    write_atomic(location(corpus), (json.dumps({"text": "unrelated words only"}) + "\n" +
                                    json.dumps({"text": query}) + "\n").encode())
    out = f"{s3}/contamination"
    assert main(["contamination", "--tasks", "winogrande", "--corpus", with_credentials(f"{s3}/corpus/*.jsonl"),
                 "--data-dir", str(DATA), "--limit", "2", "--actors", "1", "--output", out, "--no-progress"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    report = read_json(f"{out}/contamination.json")
    assert report["config"]["corpus"] == [f"s3://***@{s3[len('s3://'):]}/corpus/*.jsonl"]
    assert KEY not in printed + captured.err + location(f"{out}/contamination.json").read_text()
    assert report["tasks"]["winogrande"]["dirty"] == 1
    assert any(line.startswith("| winogrande") and line.split("|")[2:4] == [f" {2:>9} ", f" {1:>7} "]
               for line in printed.splitlines())
    assert read_parquet(f"{out}/matches.parquet").num_rows >= 1
    assert location(f"{out}/contamination.png").read_bytes()[:4] == b"\x89PNG"

    out = f"{s3}/membership"
    assert main(["membership", "--model", str(tiny_llama), "--tasks", "winogrande", "--data-dir", str(DATA),
                 "--limit", "1", "--k", "10", "--max-length", "64", "--actors", "1", "--output", out,
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    report = read_json(f"{out}/membership.json")
    rows = read_parquet(f"{out}/membership.parquet")
    assert rows["task"].to_pylist() == ["winogrande"]
    assert report["tasks"]["winogrande"]["min_k_prob_mean"] == pytest.approx(rows["min_k_prob"][0].as_py())
    assert f"{report['tasks']['winogrande']['min_k_prob_mean']:.4f}" in printed


def test_sweep_writes_points_summaries_and_plots_to_s3(ray_session, tiny_llama, s3, tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"models:\n  - path: {tiny_llama}\n    dtype: float32\ntasks: [winogrande]\n"
                    f"data_dir: {DATA}\ndevice: cpu\nsettings:\n  limit: [2]\n")
    out = f"{s3}/sweep"
    assert main(["sweep", str(path), "--output", out]) == 0
    printed = capsys.readouterr().out
    assert location(f"{out}/summary.md").read_text() in printed
    points = location(out).files()
    names = sorted(p.path[len(location(out).path) + 1:] for p in points)
    assert "summary.csv" in names and "metrics.png" in names and "winogrande_norm_scores.png" in names
    assert any(n.endswith("/results.json") for n in names) and any(n.endswith("/checkpoint/manifest.json")
                                                                      for n in names)
    assert main(["sweep", str(path), "--output", out]) == 0  # resumed from the store: nothing to run
    assert "0 point(s) run, 1 already finished" in capsys.readouterr().out
