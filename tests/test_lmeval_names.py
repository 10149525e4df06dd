"""lm-eval names -> tasks, before any data is read: lm-eval's resolution (patterns, groups, tags, --include-path),
raylm's two index shortcuts proven equal to lm-eval's own TaskManager, and the one-line refusals (unknown names
with close matches, generate_until, the missing `tasks` extra)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from conftest import STORIES
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

from raylm.cli import DEFAULT_SEEDS, build_parser
from raylm.cluster.checkpoint import table_digest
from raylm.errors import RaylmError
from raylm.models.loading import load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.lmeval import request_tables
from raylm.results.native import MIRRORS
from raylm import cache
from raylm.tasks.lmeval import index_cache
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import _include_path_manager, select

NAMES = ["mmlu_local", "arc_easy_local", "ai2_arc", "piqa_local", "boolq_local", "mmlu_local_stem"]


@pytest.fixture(scope="module")
def lm_eval_manager(local_tasks) -> TaskManager:
    """lm-eval's own TaskManager over its tasks and the local ones, as `lm_eval --include_path` builds it."""
    return TaskManager(include_path=str(local_tasks))


def loaded_view(manager: TaskManager, names: list[str]) -> tuple:
    """What a load resolves to: every task's full config, every group's children, in order."""
    loaded = manager.load(names)
    configs = {name: json.dumps(task.dump_config(), sort_keys=True, default=str)
               for name, task in loaded["tasks"].items()}
    return list(loaded["tasks"]), configs, loaded["group_map"]


@pytest.mark.parametrize("name", NAMES)
def test_include_path_alone_resolves_like_lm_evals_full_index(name, local_tasks, lm_eval_manager):
    fast = _include_path_manager([name], [str(local_tasks)])
    assert fast is not None and len(fast.all_tasks) < 100
    assert loaded_view(fast, [name]) == loaded_view(lm_eval_manager, [name])


def test_include_path_alone_is_not_used_when_lm_evals_own_tasks_are_needed(local_tasks, tmp_path):
    assert _include_path_manager(["arc_easy"], [str(local_tasks)]) is None  # lm-eval's own task
    assert _include_path_manager(["mmlu_*_local"], [str(local_tasks)]) is None  # a pattern could match builtins
    (tmp_path / "mix.yaml").write_text("group: mix\ntask:\n  - arc_easy_local\n  - arc_challenge\n")
    (tmp_path / "arc_easy_local.yaml").write_text((local_tasks / "arc_easy_local.yaml").read_text())
    # arc_challenge is lm-eval's: indexed alone, this directory would make it an empty inline task.
    assert _include_path_manager(["mix"], [str(tmp_path)]) is None
    assert sorted(select(["mix"], tmp_path).leaves) == ["arc_challenge", "arc_easy_local"]


def test_cached_index_is_lm_evals_own_and_is_rebuilt_when_a_yaml_changes(local_tasks, lm_eval_manager, tmp_path):
    directory = cache.cache_dir()  # this session's (conftest): the runs after this one read what it keeps
    for kept in directory.glob("lm-eval-*-index-*.json"):
        kept.unlink()
    index_cache.builtin_index.cache_clear()
    cold = index_cache.builtin_index()
    assert len(list(directory.glob("lm-eval-*-index-*.json"))) == 1
    index_cache.builtin_index.cache_clear()
    warm = index_cache.builtin_index()
    for index in (cold, warm):
        ours = index_cache.IndexedTaskManager(index, [str(local_tasks)])
        assert list(ours.task_index) == list(lm_eval_manager.task_index)
        assert all((a.kind, a.yaml_path, a.cfg, a.tags) == (b.kind, b.yaml_path, b.cfg, b.tags)
                   for a, b in zip(ours.task_index.values(), lm_eval_manager.task_index.values()))
        assert (ours.all_tasks, ours.all_groups, ours.all_subtasks, ours.all_tags) == (
            lm_eval_manager.all_tasks, lm_eval_manager.all_groups, lm_eval_manager.all_subtasks,
            lm_eval_manager.all_tags)
    # The key covers every YAML's size and time: an edited task file makes a new index.
    (tmp_path / "tasks").mkdir()
    yaml = tmp_path / "tasks" / "t.yaml"
    yaml.write_text("task: t\n")
    key = index_cache._key(tmp_path / "tasks")
    yaml.write_text("task: t2\n")
    assert index_cache._key(tmp_path / "tasks") != key


def test_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "raylm"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert cache.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    assert cache.cache_dir() is None


def test_names_expand_as_lm_evals_cli_does(local_tasks):
    selection = select(["mmlu_*_local", "ai2_arc"], local_tasks)
    assert selection.names[:2] == ["mmlu_abstract_algebra_local", "mmlu_anatomy_local"]
    assert "ai2_arc" in selection.names and "mmlu_local" not in selection.names
    # With this --include-path, ai2_arc is the local tag (its YAMLs replace lm-eval's tag of that name).
    assert select(["ai2_arc"], local_tasks).leaves == ["arc_easy_local"]
    assert len(select(["mmlu"], None).leaves) == 57


@pytest.mark.parametrize("name,close", [("arc_easy_locl", "arc_easy_local"), ("mmlu_anatomyy", "mmlu_anatomy")])
def test_unknown_name_is_refused_with_close_matches(name, close, local_tasks):
    with pytest.raises(RaylmError) as error:
        select(["arc_easy_local", name], local_tasks)
    message = str(error.value)
    assert message.startswith(f"unknown task '{name}' (not a native raylm task, nor an lm-eval task, group or tag)")
    assert f"close matches: {close}" in message and "\n" not in message


def test_an_output_type_raylm_does_not_run_is_refused_in_one_line(local_tasks, tmp_path):
    (tmp_path / "odd.yaml").write_text("task: odd_local\ndataset_path: arrow\noutput_type: rank_choices\n"
                                       "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n")
    (tmp_path / "gen.yaml").write_text("task: gen_local\ndataset_path: arrow\noutput_type: generate_until\n"
                                       "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "group.yaml").write_text("group: mixed_local\ntask:\n  - gen_local\n  - odd_local\n")
    with pytest.raises(RaylmError, match=r"^lm-eval task 'odd_local' has output_type rank_choices; raylm runs "
                                         r"multiple_choice, loglikelihood, loglikelihood_rolling, generate_until$"):
        select(["odd_local"], tmp_path)
    with pytest.raises(RaylmError, match=r"^lm-eval task 'odd_local' \(in mixed_local > odd_local\) has output_type "
                                         "rank_choices"):
        select(["mixed_local"], tmp_path)
    assert select(["gen_local"], tmp_path).leaves == ["gen_local"]
    assert select(["gsm8k"], None).leaves == ["gsm8k"]


def test_without_the_tasks_extra_an_lm_eval_name_names_the_install_command(tmp_path):
    probe = ("import sys; sys.modules['lm_eval'] = None\n"
             "from raylm.cli import main\n"
             f"code = main(['eval', '--model', {str(STORIES)!r}, '--tasks', 'hellaswag,arc_easy', '--output', "
             f"{str(tmp_path / 'out')!r}])\n"
             "assert 'lm_eval' not in sys.modules or sys.modules['lm_eval'] is None\n"
             "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raylm: error:")]
    assert errors == ['raylm: error: arc_easy: not native raylm tasks, and lm-eval (which defines every other '
                      'task) is not installed; install it with pip install -e ".[tasks]" in the raylm checkout']
    assert "Started a local Ray" not in proc.stderr


def test_a_native_run_never_imports_lm_eval():
    probe = ("import sys\nfrom raylm.cli import build_parser, config_from_args\nfrom raylm.evaluate import "
             "run_selection\nimport raylm.results.report, raylm.sweep.config\n"
             "cfg = config_from_args(build_parser().parse_args(['eval', '--demo']))\ncfg.validate()\n"
             "assert run_selection(cfg) is None\nprint('lm_eval' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_seed_is_lm_evals_seed_flag():
    import lm_eval.defaults

    parse = build_parser()._subparsers._group_actions[0].choices["eval"].parse_args
    assert DEFAULT_SEEDS == (lm_eval.defaults.DEFAULT_RANDOM_SEED, *[lm_eval.defaults.DEFAULT_OTHER_SEED] * 3)
    assert parse([]).seed == DEFAULT_SEEDS
    assert parse(["--seed", "5"]).seed == (5, 5, 5, 5)
    assert parse(["--seed", "0,None,8,52"]).seed == (0, None, 8, 52)
    assert parse([]).num_fewshot is None and parse([]).bootstrap_iters == 100000


@pytest.mark.parametrize("value", ["1,2,3", "7, None ,8", "5", "0,None,8,52"])
def test_seed_values_are_read_as_lm_evals_run_parser_reads_them(value):
    """Three values: lm-eval fills the fourth (fewshot) from its default seeds."""
    from lm_eval._cli.run import Run

    parser = argparse.ArgumentParser()
    Run.create(parser.add_subparsers())
    theirs = parser.parse_args(["run", "--seed", value]).seed
    assert build_parser().parse_args(["eval", "--seed", value]).seed == tuple(theirs)


@pytest.mark.parametrize("value", ["x", "1,2", "1,2,3,4,5"])
def test_bad_seed_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["eval", "--seed", value])
    assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_native_tasks_carry_the_metadata_of_lm_evals_task_of_that_name(name):
    from lm_eval.api.registry import is_higher_better

    yaml = load_yaml(index_cache.builtin_root() / {"hellaswag": "hellaswag/hellaswag.yaml",
                                                    "winogrande": "winogrande/default.yaml",
                                                    "wikitext": "wikitext/wikitext.yaml"}[name], resolve_func=False)
    mirror = MIRRORS[name]
    assert yaml["task"] == name and yaml["metadata"]["version"] == mirror.version
    assert (yaml["output_type"], yaml["dataset_path"], yaml.get("dataset_name")) == (
        mirror.output_type, mirror.dataset_path, mirror.dataset_name)
    assert {m["metric"]: m.get("higher_is_better", is_higher_better(m["metric"])) for m in yaml["metric_list"]} == \
        mirror.higher_is_better
    assert mirror.stderr == all(m.get("aggregation") == "mean" for m in yaml["metric_list"])


def test_the_task_config_is_part_of_the_request_tables_digest(local_tasks, tmp_path):
    """Two tasks with the same requests but different metrics have request tables of different digests, so a
    checkpoint of one is never resumed as the other."""
    (tmp_path / "arc_acc_local.yaml").write_text(
        f"task: arc_acc_local\ninclude: {local_tasks / 'arc_easy_local.yaml'}\ntag: null\n"
        "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n")
    (tmp_path / "arc_easy_local.yaml").write_text((local_tasks / "arc_easy_local.yaml").read_text())
    encoder = Encoder(load_tokenizer(ModelSpec(str(STORIES))), 512)
    tables = {}
    for name in ("arc_easy_local", "arc_acc_local"):
        built = load_and_build(select([name], tmp_path), DEFAULT_SEEDS, None, 3)
        tables[name] = request_tables(built, encoder)[name]
    a, b = tables["arc_easy_local"], tables["arc_acc_local"]
    assert a.replace_schema_metadata(None).equals(b.replace_schema_metadata(None))
    assert table_digest(a) != table_digest(b)
    assert a.schema.metadata[b"raylm.lmeval.version"] == b"1.0"


def test_a_native_task_reached_again_through_lm_eval_is_refused(tmp_path):
    """One rule (raylm.tasks.lmeval.selection.refuse_native_clash) for `raylm eval`, sweep files and `raylm
    contamination`."""
    from raylm.contamination.documents import load_scan_tasks
    from raylm.data.demo import DEMO_DATA
    from raylm.sweep.config import load_sweep
    from raylm.tasks.lmeval.selection import select_lmeval

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "group.yaml").write_text("group: with_hellaswag\ntask:\n  - hellaswag\n  - arc_easy\n")
    clash = "hellaswag: asked for as a native task and also reached through lm-eval's with_hellaswag; results would " \
            "share a name (use the lm-eval task alone, or rename it)"
    with pytest.raises(RaylmError) as raised:
        select_lmeval(("hellaswag", "with_hellaswag"), tasks)
    assert str(raised.value) == clash
    assert select_lmeval(("with_hellaswag",), tasks).leaves == ["hellaswag", "arc_easy"]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"models: [gpt2]\ntasks:\n  - hellaswag\n  - with_hellaswag\ninclude_path: {tasks}\n")
    with pytest.raises(RaylmError) as raised:
        load_sweep(sweep)
    assert str(raised.value) == f"{sweep}: line 4: tasks: {clash}"
    with pytest.raises(RaylmError) as raised:
        load_scan_tasks(("hellaswag", "with_hellaswag"), DEMO_DATA, tasks, 2)
    assert str(raised.value) == clash


SHADOW = ("task: winogrande\ndataset_path: my/data\noutput_type: multiple_choice\ndoc_to_text: q\ndoc_to_target: 0\n"
          "doc_to_choice: [a, b]\n")


def test_an_include_path_task_named_like_a_native_one_is_refused_not_shadowed(tmp_path):
    """lm-eval would score the YAML (include-path entries replace its own), raylm its native task: rather than
    pick one silently, both `raylm eval` and sweep files refuse the name, at its line in a sweep file."""
    from raylm.sweep.config import load_sweep
    from raylm.tasks.lmeval.selection import select_lmeval

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mine.yaml").write_text(SHADOW)
    with pytest.raises(RaylmError) as raised:
        select_lmeval(("hellaswag", "winogrande"), tasks)
    assert str(raised.value) == (f"'winogrande' is raylm's native task and also a task of --include-path "
                                 f"({tasks / 'mine.yaml'}); raylm would score its own and ignore yours: give yours "
                                 "another name (task: my_winogrande)")
    assert select_lmeval(("hellaswag",), tasks) is None  # not asked for: no clash
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"models: [gpt2]\ntasks:\n  - hellaswag\n  - winogrande\ninclude_path: {tasks}\n")
    with pytest.raises(RaylmError, match=r"sweep.yaml: line 4: tasks: 'winogrande' is raylm's native task and also"):
        load_sweep(sweep)


def test_a_kept_index_that_cannot_be_read_is_built_and_kept_again(tmp_path, monkeypatch, caplog):
    """A cache file cut short (a full disk) or overwritten is a cache miss with a warning, not a failed run."""
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    root = tmp_path / "tasks"
    root.mkdir()
    (root / "t.yaml").write_text("task: t\ndataset_path: json\noutput_type: loglikelihood\n")
    built = index_cache.cached_index(root)
    kept = tmp_path / "cache" / index_cache._key(root)
    for damaged in (kept.read_bytes()[: kept.stat().st_size // 2], b"\xff\xfe not json", b'{"t": 1}'):
        kept.write_bytes(damaged)
        with caplog.at_level("WARNING", logger=index_cache.__name__):
            assert index_cache.cached_index(root) == built
        assert "cannot be read" in caplog.text and "indexing the tasks again" in caplog.text
        assert index_cache._decode(kept.read_text()) == built
        caplog.clear()


def test_a_task_file_in_tasks_is_the_task_lm_evals_cli_loads_from_it(local_tasks, monkeypatch):
    """`--tasks DIR/x.yaml`: lm-eval's CLI (EvaluatorConfig.process_tasks) loads the file's config; raylm names its
    task with the folder as --include-path, and the task loaded is the same, config for config (but for where
    it says the config came from)."""
    import lm_eval.tasks
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from raylm.cli import config_from_args, parse_args

    path = local_tasks / "arc_easy_local.yaml"
    # the file alone decides lm-eval's task; its manager is asked nothing, so it need not index lm-eval's own tasks
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kw: TaskManager(include_defaults=False, **kw))
    theirs = EvaluatorConfig(tasks=[str(path)])
    manager = theirs.process_tasks()
    cfg = config_from_args(parse_args(["eval", "--model", str(STORIES), "--tasks", f"{path},hellaswag"]))
    assert cfg.tasks == ("arc_easy_local", "hellaswag") and cfg.include_path == local_tasks.resolve()
    ours = select(["arc_easy_local"], cfg.include_path)
    assert ours.names == ["arc_easy_local"]
    [their_task] = manager.load(theirs.tasks)["tasks"].values()
    our_config = ours.manager.load(ours.names)["tasks"]["arc_easy_local"].dump_config()
    their_config = their_task.dump_config()
    # where the config came from: lm-eval says "inline" for a config handed over as a dict, raylm names the file
    assert our_config["metadata"].pop("config_source") == str(path)
    assert their_config["metadata"].pop("config_source") == "inline"
    assert our_config == their_config


def test_a_folder_in_tasks_is_its_task_files_as_lm_evals_cli_reads_it(local_tasks, tmp_path, monkeypatch):
    """`--tasks DIR`: lm-eval's CLI (EvaluatorConfig.process_tasks) loads every DIR/*.yaml as a task file, unless
    DIR is also the name of a task, which it then runs instead; raylm names the same tasks."""
    import lm_eval.tasks
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from raylm.cli import config_from_args, parse_args
    from raylm.tasks.lmeval import names

    # Neither side's answer here depends on lm-eval's own tasks: both index the include path alone.
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kw: TaskManager(include_defaults=False, **kw))
    monkeypatch.setattr(names, "builtin_index", dict)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "arc_easy_local.yaml").write_text((local_tasks / "arc_easy_local.yaml").read_text())
    theirs = EvaluatorConfig(tasks=str(folder))
    theirs.process_tasks()
    cfg = config_from_args(parse_args(["eval", "--model", str(STORIES), "--tasks", str(folder)]))
    assert cfg.tasks == tuple(config["task"] for config in theirs.tasks) == ("arc_easy_local",)
    assert cfg.include_path == folder.resolve()

    monkeypatch.chdir(tmp_path)
    (tmp_path / "arc_easy_local").mkdir()
    argv = ["--tasks", "arc_easy_local", "--include-path", str(local_tasks)]
    theirs = EvaluatorConfig(tasks="arc_easy_local", include_path=str(local_tasks))
    theirs.process_tasks()
    cfg = config_from_args(parse_args(["eval", "--model", str(STORIES), *argv]))
    assert cfg.tasks == tuple(theirs.tasks) == ("arc_easy_local",) and cfg.include_path == local_tasks
    with pytest.raises(RaylmError, match="without task files"):
        config_from_args(parse_args(["eval", "--model", str(STORIES), "--tasks", str(tmp_path / "arc_easy_local")]))


def test_task_files_raylm_cannot_read_as_lm_eval_does_are_refused_in_one_line(local_tasks, tmp_path):
    from raylm.tasks.lmeval.names import task_files

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.yaml").write_text(f"task: mine\ninclude: {local_tasks / 'arc_easy_local.yaml'}\n")
    (tmp_path / "a" / "again.yaml").write_text(f"task: mine\ninclude: {local_tasks / 'arc_easy_local.yaml'}\n")
    (tmp_path / "b.yaml").write_text("task: [")
    for names, include, message in (
            ([str(tmp_path / "a" / "mine.yaml")], None, "defines 'mine' again"),
            ([str(tmp_path / "none*.yaml")], None, "no such task file"),
            ([str(tmp_path / "b.yaml")], None, "not a task file lm-eval can read"),
            ([str(local_tasks / "arc_easy_local.yaml")], tmp_path, "span 2 folders")):
        with pytest.raises(RaylmError, match=message):
            task_files(names, include)


def test_raylm_tasks_is_lm_evals_listing_of_tasks_groups_and_tags(local_tasks, capsys, monkeypatch):
    """`raylm tasks` / `raylm ls WHAT` print lm-eval's own list_all_tasks (as `lm-eval ls WHAT` does) over lm-eval's
    tasks and --include-path's; the include path's listing is compared with lm-eval's of it alone (its subtasks
    listing reads every YAML: for lm-eval's own 14,000 that takes minutes)."""
    from raylm.cli import main

    assert main(["tasks", "groups"]) == 0
    assert "\n|mmlu " in capsys.readouterr().out
    assert main(["ls", "tags"]) == 0
    assert "\n|ai2_arc " in capsys.readouterr().out
    theirs = TaskManager(include_path=str(local_tasks), include_defaults=False)
    monkeypatch.setattr(index_cache, "builtin_index", dict)
    listings = {"tasks": {}, "groups": {"list_subtasks": False, "list_tags": False},
                "subtasks": {"list_groups": False, "list_tags": False},
                "tags": {"list_groups": False, "list_subtasks": False}}
    for what, kwargs in listings.items():
        assert main(["ls", what, "--include_path", str(local_tasks)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("raylm's native tasks") and out.endswith(theirs.list_all_tasks(**kwargs) + "\n")
    assert main(["tasks", "--include-path", str(local_tasks)]) == 0
    out = capsys.readouterr().out
    assert all(f"\n|{name} " in out for name in ("mmlu_local", "mmlu_local_stem_tasks", "arc_easy_local"))
