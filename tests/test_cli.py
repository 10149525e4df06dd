"""The CLI as users run it: documented files on success; one-line errors, non-zero exit, no results on failure."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import psutil
import pyarrow.parquet as pq
import pytest
from conftest import DATA, run_cli
from lm_eval.utils import get_file_task_name

from raylm.cli import build_parser


@pytest.mark.slow  # a Ray of its own
def test_demo_writes_results_and_samples(tmp_path):
    out = tmp_path / "out"
    # Ray's sockets live under its temp dir and must stay under 108 characters, hence a short one of our own.
    ray_tmp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
    try:
        proc = run_cli("eval", "--demo", "--limit", "10", "--actors", "2", "--shard-size", "8", "--output",
                       str(out), "--log-samples", "--no-progress",
                       env_extra={"RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": ""})  # block-buffered, as in a pipe
        # The command exits without interpreter teardown (raylm.cli.run): the local Ray it started must be gone
        # all the same, and everything it printed must have been flushed.
        survivors = [p for p in psutil.process_iter(["cmdline"]) if ray_tmp in " ".join(p.info["cmdline"] or [])]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert survivors == []
    assert proc.stdout.rstrip().endswith(f"results written to {out / 'results.json'}")
    results = json.loads((out / "results.json").read_text())
    assert set(results["results"]) == {"hellaswag", "winogrande", "wikitext"}
    for key in ("acc,none", "acc_stderr,none", "acc_norm,none", "acc_norm_stderr,none"):
        assert 0 <= results["results"]["hellaswag"][key] <= 1
    for key in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert results["results"]["wikitext"][key] > 0
    assert results["token_perplexity"]["wikitext"] > 0  # raylm's extra, where lm-eval's tools do not look
    assert results["n-samples"]["hellaswag"] == {"original": 300, "effective": 10}
    assert results["config"]["versions"]["ray"]
    assert results["config"]["wall_time_s"] > 0
    requests = pq.read_table(out / "samples" / "hellaswag.parquet")
    assert requests.num_rows == 40
    assert {"doc_id", "req_idx", "loglikelihood", "is_greedy", "context_tokens", "continuation_tokens"} <= set(
        requests.column_names)
    docs = pq.read_table(out / "samples" / "hellaswag_docs.parquet")
    assert docs.num_rows == 10 and {"pred", "gold"} <= set(docs.column_names)
    logs = {get_file_task_name(path.name): path for path in (out / "samples").glob("samples_*.jsonl")}
    assert sorted(logs) == ["hellaswag", "wikitext", "winogrande"]  # lm-eval's jsonl for the native tasks too
    assert [json.loads(line)["doc_id"] for line in logs["hellaswag"].read_text().splitlines()] == list(range(10))
    assert "hellaswag" in proc.stdout and "acc_norm" in proc.stdout


def test_bad_input_fails_with_one_line_on_stderr_exit_2_and_no_results(tmp_path, tiny_gpt2):
    """As a user's shell sees it, in a process of its own: one line on stderr, exit 2. tests/test_bad_input.py
    runs every kind of bad input through the same main() in-process."""
    data = tmp_path / "data"
    shutil.copytree(DATA / "hellaswag", data / "hellaswag")
    lines = (data / "hellaswag" / "validation.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[4])
    del row["ctx_a"]
    lines[4] = json.dumps(row) + "\n"
    (data / "hellaswag" / "validation.jsonl").write_text("".join(lines))
    out = tmp_path / "out"
    proc = run_cli("eval", "--model", str(tiny_gpt2), "--tasks", "hellaswag", "--data-dir", str(data), "--output",
                   str(out), "--no-progress")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raylm: error:")]
    assert len(errors) == 1 and "validation.jsonl: row 5: field 'ctx_a': missing field" in errors[0], \
        proc.stderr[-2000:]
    assert not (out / "results.json").exists()


def test_the_eval_command_starts_ray_and_its_first_actor_before_torch_is_imported():
    """`raylm eval` starts Ray, then asks it for the first actor, while a thread imports torch and transformers to
    tokenise (seconds on 2 cores); a torch import on the way to ray.init or to the actor's class would put that
    time back on the critical path."""
    probe = ("import sys, raylm.cli, raylm.evaluate, raylm.cluster.runtime, raylm.cluster.scoring_actor; "
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow  # a Ray of its own
def test_an_error_raised_in_a_scoring_actor_is_one_line_naming_its_traceback_file(tmp_path, mismatched_weights_model):
    out = tmp_path / "out"
    proc = run_cli("eval", "--model", str(mismatched_weights_model), "--tasks", "winogrande", "--data-dir", str(DATA),
                   "--limit", "2", "--output", str(out), "--no-progress")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raylm: error:")]
    log = out / "raylm-error.log"
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("raylm: error: a scoring actor failed to start: RuntimeError: ")
    assert "ignore_mismatched_sizes" in errors[0] and errors[0].endswith(f" (full traceback in {log})")
    # Neither Ray's printing of the actor's traceback nor the load report the error points to ("the above
    # report") reaches the terminal, where Ray's log monitor may print it after the error line: both are in the file.
    assert "Traceback" not in proc.stderr and "LOAD REPORT" not in proc.stderr + proc.stdout
    text = log.read_text()
    assert ", in load_model\n" in text and "ignore_mismatched_sizes" in text
    assert "transformers logged (WARNING): LlamaForCausalLM LOAD REPORT" in text and "| MISMATCH |" in text
    assert not (out / "results.json").exists()


MODEL_FLAGS = ["--revision", "v2", "--trust-remote-code", "--allow-pickle", "--load-in-8bit", "--dtype", "float32",
               "--device", "cpu"]


@pytest.mark.parametrize("command", ["eval", "ppl", "kl", "probe", "membership"])
def test_every_command_that_loads_a_model_takes_the_same_model_flags(command, monkeypatch, tmp_path):
    """--revision, --trust-remote-code, --allow-pickle and the quantisation flags mean the same on eval, ppl, kl,
    probe and membership (kl's Q takes all but --revision, which is --model-b-revision)."""
    import raylm.contamination.membership_run
    import raylm.corpus.run
    import raylm.probe.run
    from raylm.cli import config_from_args, main
    from raylm.models.spec import ModelSpec

    asked = {"eval": ["eval", "--model", "org/p"], "ppl": ["ppl", "--model", "org/p", "--data", "x.txt"],
             "kl": ["kl", "--model", "org/p", "--model-b", "org/q", "--model-b-revision", "v3", "--data", "x.txt"],
             "probe": ["probe", "--model", "org/p", "--text", "a [MASK]."],
             "membership": ["membership", "--model", "org/p", "--tasks", "wikitext"]}[command] + MODEL_FLAGS
    expected = ModelSpec("org/p", "float32", "cpu", "v2", True, True, "8bit")
    seen = []

    class Stop(Exception):
        pass

    def capture(spec_or_cfg, *args):
        seen.append(spec_or_cfg)
        raise Stop

    monkeypatch.chdir(tmp_path)  # the commands make their default output folder before they are stopped
    monkeypatch.setattr(raylm.corpus.run, "run_corpus", capture)
    monkeypatch.setattr(raylm.probe.run, "Prober", capture)
    monkeypatch.setattr(raylm.contamination.membership_run, "run_membership", capture)
    if command == "eval":
        seen.append(config_from_args(build_parser().parse_args(asked)).model)
    else:
        with pytest.raises(Stop):
            main(asked)
    assert (seen[0].model if command in ("ppl", "kl", "membership") else seen[0]) == expected
    if command == "kl":
        assert seen[0].model_b == ModelSpec("org/q", "float32", "cpu", "v3", True, True, "8bit")


QUICKSTART = "eval --model org/m --tasks hellaswag,winogrande --num-fewshot 5"


@pytest.mark.parametrize("other,same", [
    ("--tasks hellaswag winogrande --batch-size 4 --actors 2 --log-samples --no-progress", True),
    ("--tasks hellaswag", False), ("--num-fewshot 0", False), ("--limit 10", False), ("--seed 1", False),
    ("--dtype bfloat16", False), ("--revision v2", False), ("--apply-chat-template", False),
    ("--gen-kwargs temperature=0.5", False), ("--bootstrap-iters 0", False), ("--shard-size 64", False)])
def test_an_eval_without_output_writes_to_a_folder_named_for_its_model_and_settings(other, same):
    """The default --output of a command line is a function of its settings alone, the same on every parse; a
    setting that changes the results changes it, one that does not (batch size, actors, samples) keeps it."""
    from raylm.cli import config_from_args, parse_args
    from raylm.cli.run_dirs import eval_dir

    def folder(line: str):
        return eval_dir(config_from_args(parse_args(line.split())))

    first = folder(QUICKSTART)
    assert first == folder(QUICKSTART) and first.parent.as_posix() == "raylm-out/org__m"
    assert first.name.startswith("hellaswag+winogrande-5shot-")
    assert (folder(f"{QUICKSTART} {other}") == first) is same


def test_a_corpus_run_without_output_writes_to_a_folder_named_for_its_model_and_settings():
    from raylm.cli.run_dirs import corpus_dir
    from raylm.corpus.run import CorpusConfig
    from raylm.models.spec import ModelSpec

    def folder(model: str = "org/m", *args, **kwargs):
        return corpus_dir(CorpusConfig(ModelSpec(model), "corpus/*.parquet", *args, **kwargs))

    assert folder() == folder(actors=4) and folder().parent.as_posix() == "raylm-out/org__m"
    assert folder().name.startswith("ppl-corpus-")
    assert len({folder(), folder(stride=64), folder("org/n"), folder("org/m", ModelSpec("org/q"))}) == 4


def quickstart(tiny_llama, *extra: str) -> list[str]:
    return ["eval", "--model", str(tiny_llama), "--data-dir", str(DATA), "--limit", "2", "--device", "cpu",
            "--no-progress", *extra]


def test_quickstart_commands_without_output_sit_side_by_side_and_a_rerun_resumes(tiny_llama, ray_session,
                                                                                 tmp_path, monkeypatch, capsys):
    """Two commands with other tasks, run in one working folder without --output, both finish, each in its own
    folder under raylm-out/<model>/, named where the run starts; the first command again resumes from its own."""
    from raylm.cli import main

    monkeypatch.chdir(tmp_path)
    runs = [(main(quickstart(tiny_llama, "--tasks", tasks)), tasks, capsys.readouterr().out)
            for tasks in ("hellaswag", "winogrande", "hellaswag")]
    assert [code for code, _, _ in runs] == [0, 0, 0]
    folders = []
    for _, tasks, printed in runs:
        folder = printed.splitlines()[0].removeprefix("writing to ").partition(";")[0]
        assert printed.rstrip().endswith(f"results written to {folder}/results.json")
        folders.append(folder)
        results = json.loads((tmp_path / folder / "results.json").read_text())
        assert list(results["results"]) == [tasks]
    assert folders[0] == folders[2] != folders[1]
    assert all(f.startswith(f"raylm-out/{tiny_llama.name}/") for f in folders)
    assert results["config"]["shards_resumed"] == results["config"]["shards"] > 0


def test_output_path_runs_with_other_tasks_each_add_a_results_file(tiny_llama, ray_session, tmp_path):
    """lm-eval's --output_path: a second command line with other tasks into the same folder finishes and adds
    its results file, as lm-eval's does; raylm's own folders sit apart inside."""
    from lm_eval.utils import sanitize_model_name

    from raylm.cli import main

    for tasks in ("hellaswag", "winogrande"):
        assert main(quickstart(tiny_llama, "--tasks", tasks, "--output_path", str(tmp_path))) == 0
    model_dir = tmp_path / sanitize_model_name(str(tiny_llama))
    files = sorted(model_dir.glob("results_*.json"), key=lambda p: p.stat().st_mtime_ns)
    assert [list(json.loads(p.read_text())["results"]) for p in files] == [["hellaswag"], ["winogrande"]]
    assert len(list((model_dir / ".raylm").iterdir())) == 2
