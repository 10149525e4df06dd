"""lm-eval-backed tasks end to end on real Ray actors: `raylm eval` with native and lm-eval tasks side by side
(results.json in lm-eval's shape, lm-eval's make_table and result schema, --log-samples Parquet), results
independent of actor count and shard size, PIQA's over-long rows refused in one line,
sweeps with lm-eval names, and lm_eval.simple_evaluate on raylm's actors through RayLM."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import subprocess
import sys
import threading

import lm_eval
import pyarrow.parquet as pq
import pytest
import ray
from conftest import DATA, STORIES, tasks_only
from fixture_data import ORIGINAL, read_golden
from lm_eval.result_schema import EvalResults
from lm_eval.utils import get_file_task_name, make_table, sanitize_model_name
from pydantic import TypeAdapter, ValidationError

from raylm.api import RayLM
from raylm.cache import CACHE_DIR_ENV, cache_dir
from raylm.cli import main
from raylm.cluster.checkpoint import CHECKPOINT_DIR
from raylm.evaluate import startup
from raylm.cluster.runtime import start_actors
from raylm.config import EvalConfig
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec
from raylm.requests import lmeval as lmeval_requests
from raylm.sweep.config import load_sweep
from raylm.sweep.run import run_sweep

# lm-eval tasks (multiple choice, a group, a rolling task), then two native tasks
TASKS = ("arc_easy_local", "mmlu_local", "boolq_text_local", "hellaswag", "wikitext")
LMEVAL_TASKS = ("arc_easy_local", "mmlu_local", "boolq_text_local")
MMLU_SUBJECTS = ("mmlu_abstract_algebra_local", "mmlu_anatomy_local", "mmlu_college_computer_science_local",
                 "mmlu_high_school_geography_local", "mmlu_nutrition_local", "mmlu_philosophy_local")
LIMIT = 4


@pytest.fixture(scope="module")
def tasks_dir(local_tasks, tmp_path_factory):
    """The local tasks, plus a loglikelihood_rolling task of lm-eval's (BoolQ passages thrice over: several of
    stories260K's 512-token windows each), its perplexity metrics lm-eval's generic ones."""
    out = tmp_path_factory.mktemp("tasks")
    for path in local_tasks.iterdir():
        (out / path.name).write_text(path.read_text())
    (out / "boolq_text_local.yaml").write_text(
        f"task: boolq_text_local\ninclude: {local_tasks / 'boolq_local.yaml'}\ntag: null\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{passage}} {{passage}} {{passage}}'\ndoc_to_choice: null\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    return out


def eval_args(local_tasks, out, *extra: str) -> list[str]:
    return ["eval", "--model", str(STORIES), "--tasks", ",".join(TASKS), "--include-path", str(local_tasks),
            "--data-dir", str(DATA), "--limit", str(LIMIT), "--shard-size", "4", "--bootstrap-iters", "1000",
            "--output", str(out), "--no-progress", *extra]


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory):
    """Where cli_run's lm-eval W&B logging, in W&B's offline mode, keeps the run's files."""
    return tmp_path_factory.mktemp("wandb-dir")


@pytest.fixture(scope="module")
def cli_run(ray_session, tasks_dir, wandb_dir, tmp_path_factory):
    """The command line through main() on the session's Ray: a process and a Ray of its own would prove nothing
    the demo's and the error tests' CLI runs (tests/test_cli.py) do not."""
    lmeval_out = tmp_path_factory.mktemp("lmeval-cli") / "out"
    argv = eval_args(tasks_dir, lmeval_out, "--log-samples", "--wandb_args", "project=raylm-tests,mode=offline",
                     f"dir={wandb_dir}", "--wandb_config_args", "suite=lmeval")
    argv[argv.index("--output")] = "--output_path"  # lm-eval's layout, raylm's own folder inside it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    [out] = (lmeval_out / sanitize_model_name(str(STORIES)) / ".raylm").iterdir()  # this command line's own
    return printed.getvalue(), out, json.loads((out / "results.json").read_text())


def test_wandb_args_log_lm_evals_tables_through_its_own_logger(cli_run, wandb_dir):
    """--wandb_args: lm-eval's WandbLogger logged the results table, every task's metrics and samples, offline."""
    _, _, results = cli_run
    [run_dir] = (wandb_dir / "wandb").glob("offline-run-*")
    [table_file] = (run_dir / "files" / "media" / "table" / "evaluation").glob("eval_results_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["Tasks", "Version", "Filter", "num_fewshot", "Metric", "Value", "Stderr"]
    rows = {(row[0], row[4]): row[5] for row in table["data"]}
    assert rows[("arc_easy_local", "acc")] == str(results["results"]["arc_easy_local"]["acc,none"])
    assert rows[("wikitext", "word_perplexity")] == str(results["results"]["wikitext"]["word_perplexity,none"])
    logged = (run_dir / f"run-{run_dir.name.rsplit('-', 1)[1]}.wandb").read_bytes()  # W&B's record log
    assert b"arc_easy_local/acc" in logged and b"suite" in logged and b"arc_easy_local_eval_results" in logged


def test_results_json_has_lm_evals_full_shape_for_native_and_lm_eval_tasks(cli_run):
    _, _, results = cli_run
    groups = ["mmlu_local", "mmlu_local_humanities", "mmlu_local_other", "mmlu_local_social_sciences",
              "mmlu_local_stem"]
    assert set(results["results"]) == {"arc_easy_local", "boolq_text_local", "hellaswag", "wikitext", *MMLU_SUBJECTS,
                                       *groups}
    assert list(results)[:9] == ["results", "groups", "group_subtasks", "configs", "versions", "n-shot",
                                 "higher_is_better", "n-samples", "config"]
    assert set(results["groups"]) == set(groups)
    assert results["group_subtasks"]["mmlu_local_stem"] == ["mmlu_abstract_algebra_local", "mmlu_anatomy_local",
                                                             "mmlu_college_computer_science_local"]
    for name in ("arc_easy_local", "boolq_text_local", "hellaswag", "wikitext", *MMLU_SUBJECTS):
        entry = results["results"][name]
        assert (entry["name"], entry["sample_len"]) == (name, LIMIT)
        assert results["n-samples"][name]["effective"] == LIMIT and results["n-shot"][name] == 0
        assert name in results["configs"] and name in results["versions"] and name in results["higher_is_better"]
    assert results["versions"]["hellaswag"] == 1.0 and results["versions"]["wikitext"] == 2.0
    assert results["higher_is_better"]["wikitext"]["word_perplexity"] is False
    assert results["results"]["wikitext"]["word_perplexity_stderr,none"] == "N/A"
    assert results["results"]["mmlu_philosophy_local"]["alias"] == "philosophy"
    assert results["n-samples"]["hellaswag"]["original"] == 1000
    # raylm's extras, under keys lm-eval does not read
    assert set(results["sums"]) == {"arc_easy_local", "boolq_text_local", "hellaswag", "wikitext", *MMLU_SUBJECTS}
    assert results["sums"]["arc_easy_local"]["requests"] == 4 * LIMIT
    assert set(results["token_perplexity"]) == {"boolq_text_local", "wikitext"}
    assert results["results"]["boolq_text_local"]["word_perplexity_stderr,none"] == "N/A"
    config = results["config"]
    assert (config["random_seed"], config["numpy_seed"], config["torch_seed"], config["fewshot_seed"]) == (
        0, 1234, 1234, 1234)
    assert config["bootstrap_iters"] == 1000 and config["num_fewshot"] is None and config["wall_time_s"] > 0


def test_the_printed_table_is_lm_evals_make_table_with_groups_indented(cli_run):
    printed, _, results = cli_run
    tasks, groups = make_table(results), make_table(results, "groups")
    assert tasks in printed and groups in printed
    assert "| - humanities " in tasks and "|  - philosophy " in tasks and "|hellaswag " in tasks
    assert "|wikitext " in tasks and "bits_per_byte" in tasks and "|mmlu_local " in groups


def schema_problems(results: dict) -> set[tuple[str, str]]:
    """Where a results dict departs from lm_eval.result_schema.EvalResults (TypedDicts lm-eval never checks at
    run time), as (section, what), after the JSON round trip a reader sees."""
    try:
        TypeAdapter(EvalResults).validate_python(json.loads(json.dumps(results, default=str)))
    except ValidationError as error:
        problems = set()
        for e in error.errors():
            where = e["loc"]
            if where[0] == "configs":
                problems.add(("configs", "a config value that is not a string"))
            elif where[0] in ("results", "groups") and str(where[2]).endswith("_stderr,none") and e["input"] == "N/A":
                problems.add((str(where[0]), '"N/A" stderr'))
            else:
                problems.add((".".join(map(str, where)), e["msg"]))
        return problems
    return set()


def test_results_json_is_as_valid_an_eval_results_as_lm_evals_own(cli_run, local_tasks):
    _, _, results = cli_run
    ours = schema_problems(results)
    # lm-eval's own output departs in these two ways too: its configs hold lists and dicts, and a metric without
    # a stderr function (wikitext's perplexities) gets "N/A".
    golden = read_golden(ORIGINAL)
    theirs = schema_problems({"results": golden["results"]}) | schema_problems(
        {"configs": {"t": tasks_only(local_tasks).load(["arc_easy_local"])["tasks"][
            "arc_easy_local"].dump_config()}})
    assert ours == theirs == {("configs", "a config value that is not a string"), ("results", '"N/A" stderr')}


def test_log_samples_writes_lm_evals_logged_fields_per_request_and_document(cli_run):
    _, out, results = cli_run
    requests = pq.read_table(out / "samples" / "arc_easy_local.parquet")
    assert requests.num_rows == 4 * LIMIT
    assert requests.column_names == ["doc_id", "req_idx", "arguments", "loglikelihood", "is_greedy",
                                     "context_tokens", "continuation_tokens", "windows"]
    first = requests.slice(0, 1).to_pylist()[0]
    assert first["arguments"] == ["Question: Which technology was developed most recently?\nAnswer:",
                                  " cellular telephone"]
    docs = pq.read_table(out / "samples" / "arc_easy_local_docs.parquet")
    assert docs.num_rows == LIMIT and {"doc_id", "doc", "target", "arguments", "loglikelihoods", "is_greedy",
                                       "filter", "filtered_resps", "metrics", "acc", "acc_norm", "doc_hash",
                                       "prompt_hash", "target_hash"} <= set(docs.column_names)
    assert sum(docs["acc"].to_pylist()) / LIMIT == results["results"]["arc_easy_local"]["acc,none"]
    assert docs["loglikelihoods"].to_pylist()[0] == requests["loglikelihood"].to_pylist()[:4]
    for subject in MMLU_SUBJECTS:
        assert pq.read_table(out / "samples" / f"{subject}_docs.parquet").num_rows == LIMIT
    rolling = pq.read_table(out / "samples" / "boolq_text_local.parquet").to_pylist()
    assert len(rolling) == LIMIT and max(r["windows"] for r in rolling) > 1 and rolling[0]["is_greedy"] is None
    assert all(r["continuation_tokens"] > 0 and len(r["arguments"]) == 1 for r in rolling)
    native = pq.read_table(out / "samples" / "hellaswag_docs.parquet")
    assert native.num_rows == LIMIT  # native, each document with lm-eval's doc_hash (raylm compare)
    assert len(set(native["doc_hash"].to_pylist())) == LIMIT
    # --output_path: lm-eval's own files where its tooling globs them, beside raylm's folder (no jsonl inside it)
    [results_file] = out.parent.parent.glob("results_*.json")
    logs = {get_file_task_name(p.name): p for p in out.parent.parent.glob("samples_*.jsonl")}
    assert sorted(logs) == sorted(results["configs"]) and not list(out.rglob("*.jsonl"))
    assert {p.stem.rsplit("_", 1)[1] for p in logs.values()} == {results_file.stem.rsplit("_", 1)[1]}
    theirs = json.loads(results_file.read_text())
    assert theirs["results"] == results["results"] and set(theirs["task_hashes"]) == set(logs)
    assert theirs["model_name_sanitized"] == out.parent.parent.name and theirs["model_source"] == "hf"
    assert len(logs["arc_easy_local"].read_text().splitlines()) == LIMIT


@pytest.fixture(scope="module")
def runs(ray_session, tasks_dir, tmp_path_factory):
    """The same lm-eval tasks on 1 actor with big shards and on 2 actors with shards of 3 requests, the second
    run reading the request tables the first kept in a cache directory of their own (their files' modification
    times after each run under "kept"); the two actors are started once, the first scoring alone. Then
    ("streamed") shards of 3 on an actor the run starts itself, each task's table after the first built only once
    that actor has scored a shard ("waited": whether it had)."""
    spec = ModelSpec(str(STORIES), dtype="float32", device="cpu")
    out: dict = {"kept": [], "waited": []}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("raylm-cache")))
        actors = start_actors(spec, 2, None)
        try:
            for n_actors, shard_requests in ((1, 512), (2, 3)):
                cfg = EvalConfig(spec, LMEVAL_TASKS, limit=6, shard_requests=shard_requests, progress=False,
                                 include_path=tasks_dir, bootstrap_iters=1000)
                out[n_actors] = evaluate(cfg, actors[:n_actors])
                out["kept"].append({p: p.stat().st_mtime_ns for p in (cache_dir() / "requests").iterdir()})
        finally:
            for actor in actors:
                ray.kill(actor)
        scored, built = threading.Event(), []

        def scoring(*args, **kwargs):
            report = real_score_shards(*args, **kwargs)
            scored.set()
            return report

        def building(requests, *args, **kwargs):
            if built:
                out["waited"].append(scored.wait(timeout=60))
            built.append(requests[0].task)
            return real_request_table(requests, *args, **kwargs)

        real_score_shards, real_request_table = startup.score_shards, lmeval_requests.request_table
        patch.setattr(startup, "score_shards", scoring)  # the first actor's scoring beside the build
        patch.setattr(lmeval_requests, "request_table", building)
        # One CPU for the actor leaves the build one of the session's two (FirstActor.scores_beside_the_build).
        out["streamed"] = evaluate(EvalConfig(spec, LMEVAL_TASKS, limit=6, shard_requests=3, progress=False,
                                              include_path=tasks_dir, bootstrap_iters=1000, actors=1, num_cpus=1))
    return out


def test_lm_eval_results_do_not_depend_on_actors_or_shard_size(runs):
    one, two = runs[1], runs[2]
    assert len(runs["kept"][0]) == len(one.tasks) and runs["kept"][1] == runs["kept"][0]  # read back, not rebuilt
    assert two.extra["shards"] > one.extra["shards"]
    assert set(one.tasks) == {"arc_easy_local", "boolq_text_local", *MMLU_SUBJECTS}
    for name, a in one.tasks.items():
        b = two.tasks[name]
        assert {k: v for k, v in a.sums.items() if k != "nll"} == {k: v for k, v in b.sums.items() if k != "nll"}
        # float32 kernels round differently for different batch shapes: ~1e-5 per request (see README)
        assert a.sums["nll"] == pytest.approx(b.sums["nll"], rel=1e-6)
        assert a.scored.select(["doc_id", "req_idx", "window"]).equals(b.scored.select(["doc_id", "req_idx", "window"]))
    for section in ("results", "groups", "n-samples", "n-shot", "versions"):
        assert_same(one.lmeval[section], two.lmeval[section])
    # config.tokens: the same tokens held whatever the shards; the actors computed each shared prefix once per
    # shard, so fewer with big shards, and never more than the requests hold.
    tokens_one, tokens_two = one.extra["tokens"], two.extra["tokens"]
    assert tokens_one.keys() == tokens_two.keys() == set(one.tasks)
    for name in one.tasks:
        held = tokens_one[name]["in_requests"]
        assert held == tokens_two[name]["in_requests"] > 0
        assert tokens_one[name]["computed"] <= tokens_two[name]["computed"] <= held
    assert sum(t["computed"] for t in tokens_one.values()) < sum(t["in_requests"] for t in tokens_one.values())


def test_a_dry_run_plans_the_tokens_the_runs_actors_computed(runs, tasks_dir):
    """`--dry-run`'s counts (raylm.evaluate.dry_run) are the runs' config.tokens exactly, per task and shard size:
    the scorer's own planner, run on the driver over the same shards."""
    from raylm.evaluate.dry_run import eval_plan

    spec = ModelSpec(str(STORIES), dtype="float32", device="cpu")
    for n_actors, shard_requests in ((1, 512), (2, 3)):
        plan = eval_plan(EvalConfig(spec, LMEVAL_TASKS, limit=6, shard_requests=shard_requests, progress=False,
                                    include_path=tasks_dir, bootstrap_iters=1000))
        planned = {name: {"in_requests": t["in_requests"], "computed": t["computed"]["cpu"]}
                   for name, t in plan["tasks"].items()}
        assert planned == runs[n_actors].extra["tokens"]


def test_scoring_starts_while_later_tasks_are_still_being_built_and_gives_the_same_numbers(runs):
    """The first actor scores the first tasks' shards while the driver builds the rest (each later table waited
    here for a scored shard, and got one), and those shards count as the run's: the numbers are those of the
    same shards scored after a whole build."""
    streamed, two = runs["streamed"], runs[2]
    assert runs["waited"] and all(runs["waited"])
    assert 0 < streamed.extra["shards_scored_while_building"] < streamed.extra["shards"] == two.extra["shards"]
    assert streamed.extra["requests_scored"] == two.extra["requests_scored"]
    for name, a in two.tasks.items():
        b = streamed.tasks[name]
        assert a.sums == pytest.approx(b.sums, rel=1e-6)
        assert a.scored.select(["doc_id", "req_idx", "window"]).equals(b.scored.select(["doc_id", "req_idx", "window"]))
    for section in ("results", "groups", "n-samples", "n-shot", "versions"):
        assert_same(streamed.lmeval[section], two.lmeval[section])


def assert_same(ours: dict, theirs: dict) -> None:
    """Equal, floats to 1e-9 relative (float32 kernels round differently for different batch shapes)."""
    assert ours.keys() == theirs.keys()
    for name, metrics in ours.items():
        if not isinstance(metrics, dict):
            assert metrics == theirs[name], name
            continue
        assert metrics.keys() == theirs[name].keys(), name
        for key, value in metrics.items():
            expected = theirs[name][key]
            assert value == (pytest.approx(expected, rel=1e-9) if isinstance(value, float) else expected), (name, key)


def test_continuations_longer_than_the_context_are_named_in_one_line(ray_session, local_tasks, tmp_path, capsys):
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["eval", "--model", str(STORIES), "--tasks", "piqa_local", "--include-path", str(local_tasks),
                 "--output", str(out), "--no-progress"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raylm: error:")]
    assert errors == ["raylm: error: piqa_local: 4 continuation(s) longer than the model's 512-token context, which "
                      "lm-eval cannot score either: doc 314 request 0 (624 tokens), doc 314 request 1 (618 tokens), "
                      "doc 1554 request 0 (557 tokens), doc 1554 request 1 (551 tokens)"]
    assert not (out / "results.json").exists() and not (out / CHECKPOINT_DIR).exists()


def test_unknown_name_fails_before_ray_starts(local_tasks, tmp_path, capsys, monkeypatch):
    """Refused before connect(), which starts or attaches to Ray, is called: a typo costs no cluster."""
    import raylm.evaluate.driver

    monkeypatch.setattr(raylm.evaluate.driver, "connect", lambda **_: pytest.fail("Ray was reached for an unknown name"))
    capsys.readouterr()
    assert main(["eval", "--model", str(STORIES), "--tasks", "arc_easy_local,arc_easy_locl", "--include-path",
                 str(local_tasks), "--output", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raylm: error:")]
    assert len(errors) == 1 and "unknown task 'arc_easy_locl'" in errors[0] and "arc_easy_local" in errors[0]


def test_a_sweep_runs_lm_eval_tasks_and_groups(ray_session, local_tasks, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"models:\n  - path: {STORIES}\n    dtype: float32\n"
                    f"tasks: [arc_easy_local, mmlu_local, winogrande]\ninclude_path: {local_tasks}\n"
                    f"data_dir: {DATA}\ndevice: cpu\nsettings:\n  limit: [3]\n")
    sweep = load_sweep(path)
    assert [p.name for p in sweep.points] == ["defaultshot-limit3-batchauto"]
    out = tmp_path / "out"
    run_sweep(sweep, out)
    point = out / sweep.models[0].name / sweep.points[0].name
    results = json.loads((point / "results.json").read_text())
    assert {"arc_easy_local", "mmlu_local", "mmlu_anatomy_local", "winogrande"} <= set(results["results"])
    assert pq.read_table(point / "samples" / "arc_easy_local_docs.parquet").num_rows == 3
    header = (out / "summary.md").read_text().splitlines()[0]
    assert header == ("| model | point | arc_easy_local acc | arc_easy_local acc_norm | mmlu_local acc | "
                      "winogrande acc |")
    assert "mmlu_local acc stderr" in (out / "summary.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("tasks,include,expected", [
    ("[arc_easy_local, mmlu_anatomyy]", True, "line 2: tasks: unknown task 'mmlu_anatomyy'"),
    ("[arc_easy_local]", False, "line 2: tasks: unknown task 'arc_easy_local'"),
    ("[hellaswag, arc_easy_local]", "missing", "line 3: include_path: directory"),
])
def test_sweep_files_check_lm_eval_names_with_line_numbers(tasks, include, expected, local_tasks, tmp_path):
    from raylm.errors import RaylmError

    path = tmp_path / "sweep.yaml"
    where = tmp_path / "nowhere" if include == "missing" else local_tasks
    path.write_text(f"models: [gpt2]\ntasks: {tasks}\n" + (f"include_path: {where}\n" if include else ""))
    with pytest.raises(RaylmError) as error:
        load_sweep(path)
    assert str(error.value).startswith(f"{path}: {expected}"), str(error.value)


def test_simple_evaluate_on_raylm_actors_gives_raylm_evals_numbers(ray_session, tasks_dir, cli_run):
    _, out, ours = cli_run
    manager = tasks_only(tasks_dir)
    with RayLM(pretrained=str(STORIES), actors=2, shard_size=8) as lm:
        theirs = lm_eval.simple_evaluate(model=lm, tasks=list(LMEVAL_TASKS), task_manager=manager, limit=LIMIT,
                                         bootstrap_iters=1000)
    assert theirs["config"]["model"] == str(STORIES)
    for section in ("group_subtasks", "n-samples", "n-shot", "versions", "higher_is_better"):
        assert {k: v for k, v in ours[section].items() if k in theirs[section]} == theirs[section], section
    assert_same(json.loads(json.dumps(theirs["results"], default=str)),
                {name: ours["results"][name] for name in theirs["results"]})
    # per request: the same loglikelihoods as raylm eval's, up to float32 rounding across batch shapes
    for task in ("arc_easy_local", "boolq_text_local"):
        requests = pq.read_table(out / "samples" / f"{task}.parquet")["loglikelihood"].to_pylist()
        logged = [resp[0][0] if isinstance(resp[0], tuple) else resp[0]
                  for s in theirs["samples"][task] for resp in s["resps"]]
        assert logged == pytest.approx(requests, rel=1e-6, abs=1e-4), task


def test_raylm_is_an_lm_eval_model_name_without_hiding_lm_evals_own():
    probe = ("import raylm.api\nfrom lm_eval.api.registry import get_model\n"
             "print(get_model('hf').__name__, get_model('raylm').__name__)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["HFLM", "RayLM"], proc.stderr[-2000:]


def test_simple_evaluate_takes_raylm_by_name(ray_session, local_tasks):
    """Last in this module: the RayLM simple_evaluate builds from the name is never closed, so its actor lives
    until the object is collected (Ray stops an actor once no handle to it is left)."""
    results = lm_eval.simple_evaluate(model="raylm", model_args=f"pretrained={STORIES},actors=1,shard_size=4",
                                      tasks=["arc_easy_local"], task_manager=tasks_only(local_tasks),
                                      limit=2, bootstrap_iters=0)
    assert results["results"]["arc_easy_local"]["sample_len"] == 2
    assert results["results"]["arc_easy_local"]["acc_stderr,none"] == "N/A"
    gc.collect()
