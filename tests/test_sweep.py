"""Sweeps on real Ray actors: every file written, each model loaded once per actor for all its points, results
equal to a plain evaluation, resuming skips finished points, and bad sweep files name the line and key."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
from conftest import DATA, run_cli

import raylm.sweep.run
from raylm.cli import build_parser, config_from_args
from raylm.cluster.runtime import start_actors
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.sweep.config import Sweep, load_sweep
from raylm.sweep.dry_run import sweep_plan
from raylm.sweep.run import SUPERSEDED_DIR, run_sweep

REPO = Path(__file__).resolve().parents[1]
POINTS = ("0shot-limit3-batchauto", "1shot-limit3-batchauto")
TASKS = ("winogrande", "wikitext")
CORPUS_POINT = "corpus-wiki"  # the sweep's corpus: WikiText lines in two domains, as gzip'd JSONL


def write_corpus(directory: Path) -> Path:
    """Eight WikiText lines, two domains (headings and paragraphs), as Paloma ships its shards."""
    import gzip

    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()][:8]
    path = directory / "wiki.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for line in lines:
            kind = "heading" if line.strip().startswith("=") else "paragraph"
            f.write(json.dumps({"text": line, "source": kind}) + "\n")
    return path


def write_sweep(tmp_path: Path, tiny_llama: Path, tiny_gpt2: Path) -> Path:
    (tmp_path / "models").mkdir(exist_ok=True)
    for name, source in (("llama", tiny_llama), ("gpt2", tiny_gpt2)):
        link = tmp_path / "models" / name
        if not link.exists():
            link.symlink_to(source)
    write_corpus(tmp_path)
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""\
models:
  - path: models/llama      # relative to this file
    dtype: float32
  - path: models/gpt2
    dtype: float32
tasks: [winogrande, wikitext]
corpora:
  - name: wiki
    data: wiki.jsonl.gz     # relative to this file
    domain_column: source
    max_length: 32
data_dir: {DATA}
device: cpu
settings:
  num_fewshot: [0, 1]
  limit: [3]
""")
    return path


class CountingStarts:
    """Wraps start_actors so a test sees every model load the sweep asks for."""

    def __init__(self):
        self.models: list[str] = []
        self.cpus: list[float | None] = []

    def __call__(self, spec, *args, **kwargs):
        actors = start_actors(spec, *args, **kwargs)
        self.models.extend(Path(spec.path).name for _ in actors)
        self.cpus.append(args[3] if len(args) > 3 else kwargs.get("num_cpus"))
        return actors


@pytest.fixture(scope="module")
def swept(ray_session, tiny_llama, tiny_gpt2, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    sweep = load_sweep(write_sweep(root, tiny_llama, tiny_gpt2))
    starts = CountingStarts()
    mp = pytest.MonkeyPatch()
    mp.setattr(raylm.sweep.run, "start_actors", starts)
    try:
        runs = run_sweep(sweep, root / "out")
    finally:
        mp.undo()
    return sweep, root / "out", runs, starts


def test_sweep_writes_every_point_and_report(swept):
    sweep, out, _, _ = swept
    assert [m.name for m in sweep.models] == ["llama-float32", "gpt2-float32"]
    for model in ("llama-float32", "gpt2-float32"):
        for shots, point in enumerate(POINTS):
            results = json.loads((out / model / point / "results.json").read_text())
            assert set(results["results"]) == set(TASKS)
            assert results["config"]["num_fewshot"] == shots and results["config"]["limit"] == 3
            assert results["config"]["sweep"]["point"] == point
            assert pq.read_table(out / model / point / "samples" / "winogrande.parquet").num_rows == 6
    csv_lines = (out / "summary.csv").read_text().splitlines()
    assert csv_lines[0].startswith("model,point,dtype,quantization,num_fewshot,limit,batch_size,winogrande acc,")
    assert csv_lines[0].endswith(",corpus,domain,bits_per_byte,token_perplexity,word_perplexity,byte_perplexity,"
                                 "tokens,docs")
    # 4 task points, then per model the corpus, its macro average and its two domains
    assert len(csv_lines) == 1 + 4 + 2 * 4
    results = json.loads((out / "llama-float32" / CORPUS_POINT / "results.json").read_text())["results"]["ppl"]
    assert csv_lines[5].startswith(f"llama-float32,{CORPUS_POINT},float32,")
    assert csv_lines[5].endswith(f",wiki,,{results['bits_per_byte']!r},{results['token_perplexity']!r},"
                                 f"{results['word_perplexity']!r},{results['byte_perplexity']!r},"
                                 f"{results['tokens']!r},{results['docs']!r}")
    assert [line.split(",")[-7] for line in csv_lines[5:9]] == ["", "(macro)", "heading", "paragraph"]
    table = (out / "summary.md").read_text().splitlines()
    assert table[:3] == ["## Tasks", "", "| model | point | winogrande acc | wikitext word_perplexity | "
                                        "wikitext bits_per_byte |"]
    assert len(table) == 2 + 6 + 3 + 10 and " ± " in table[4]  # headings, tasks table, gap, corpora table
    corpora = table[table.index("## Corpora") + 2:]
    assert corpora[0] == ("| model | corpus | domain | bits_per_byte | token_perplexity | word_perplexity | "
                          "byte_perplexity | tokens | docs |")
    assert corpora[2].startswith(f"| llama-float32 | wiki | all | {results['bits_per_byte']:.4f} |")
    assert corpora[3].startswith("| llama-float32 | wiki | macro average | ")
    for png in ("metrics.png", "winogrande_norm_scores.png", "corpora.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "wikitext_norm_scores.png").exists()


def test_a_point_decontaminated_with_another_scan_is_recomputed_not_reused(swept, tmp_path):
    """The checkpoint fingerprints what the shards depend on; the `_decontaminate` metrics also depend on the scan,
    so results.json records the scan's digest and a sweep given another scan recomputes the point (resuming every
    shard from its checkpoint: nothing is moved aside)."""
    from dataclasses import replace

    from raylm.sweep.run import point_is_current

    sweep, out, _, _ = swept
    model, point = sweep.models[0], sweep.points[0]
    assert point_is_current(sweep, model, point, out)
    (tmp_path / "contamination.json").write_text(json.dumps({"config": {"command": "contamination"}, "tasks": {}}))
    assert not point_is_current(replace(sweep, decontaminate=tmp_path), model, point, out)
    assert (out / model.name / point.name / "results.json").is_file() and not (out / "superseded").exists()


def test_each_model_loaded_once_for_all_its_points(swept):
    _, out, runs, starts = swept
    assert sorted(starts.models) == ["gpt2", "llama"]
    manifest = json.loads((out / "sweep.json").read_text())
    pids = {}
    for model in ("llama-float32", "gpt2-float32"):
        assert manifest[model]["loads"] == 1 and manifest[model]["points_run"] == [*POINTS, CORPUS_POINT]
        used = {tuple(json.loads((out / model / p / "results.json").read_text())["config"]["sweep"]["actor_pids"])
                for p in POINTS}
        assert used == {tuple(manifest[model]["actor_pids"])}
        pids[model] = used.pop()
    assert pids["llama-float32"] != pids["gpt2-float32"]
    assert runs["llama-float32"].loads == 1


def test_points_evaluate_with_the_cpu_share_their_actors_started_with(swept):
    """evaluate() starts any replacement actor from the point's config, so it must carry the sweep's share."""
    _, out, _, starts = swept
    assert starts.cpus == [1.0, 1.0]  # two models sharing the session's 2 CPUs
    for model in ("llama-float32", "gpt2-float32"):
        for point in POINTS:
            assert json.loads((out / model / point / "results.json").read_text())["config"]["num_cpus"] == 1.0


def test_sweep_point_equals_plain_evaluation(swept):
    sweep, out, _, _ = swept
    model, point = sweep.models[0], sweep.points[1]
    cfg = sweep.config(model, point)
    actors = start_actors(cfg.model, 1, None, num_cpus=1)
    try:
        plain = evaluate(cfg, actors)
    finally:
        ray.kill(actors[0])
    swept_sums = json.loads((out / model.name / point.name / "results.json").read_text())["sums"]
    assert swept_sums["winogrande"] == plain.tasks["winogrande"].sums
    assert swept_sums["wikitext"]["nll"] == pytest.approx(plain.tasks["wikitext"].sums["nll"], rel=1e-9)


def test_resume_runs_only_unfinished_points(swept, tiny_llama, tiny_gpt2, monkeypatch):
    sweep, out, _, _ = swept
    gpt2_before = {p: (out / "gpt2-float32" / p / "results.json").read_bytes() for p in POINTS}
    (out / "llama-float32" / POINTS[1] / "results.json").unlink()
    plan = sweep_plan(sweep, out)  # --dry-run: the same judgement, nothing moved, nothing loaded
    starts = CountingStarts()
    monkeypatch.setattr(raylm.sweep.run, "start_actors", starts)
    runs = run_sweep(sweep, out)
    planned = {m["model"]: (m["runs"], m["skips"]) for m in plan["models"]}
    assert planned == {name: (run.points_run, run.points_skipped) for name, run in runs.items()}
    assert plan["order"] == ["llama-float32"]
    [resumed] = [p["plan"] for p in plan["models"][0]["points"] if "plan" in p]
    assert resumed["shards"]["left"] == 0 < resumed["shards"]["done"]  # its checkpoint holds every shard
    assert starts.models == ["llama"]
    assert runs["llama-float32"].points_run == [POINTS[1]]
    assert runs["llama-float32"].points_skipped == [POINTS[0], CORPUS_POINT]
    assert runs["gpt2-float32"].loads == 0 and runs["gpt2-float32"].points_skipped == [*POINTS, CORPUS_POINT]
    assert {p: (out / "gpt2-float32" / p / "results.json").read_bytes() for p in POINTS} == gpt2_before
    assert (out / "llama-float32" / POINTS[1] / "results.json").is_file()
    assert len((out / "summary.csv").read_text().splitlines()) == 13


FLOAT32_SHAPES = 1e-5  # float32 NLLs scored in other kernel shapes (the docstring below)


def test_a_corpus_point_equals_a_standalone_raylm_ppl_run(swept, tmp_path):
    """The corpus scored on the sweep's resident actor (raylm.corpus.resident) against `raylm ppl`'s own path, a Ray
    Data actor pool loading the model, on the same corpus and options: counts and the domains exact; each
    document's NLL to float32 rounding (the two score other windows side by side: other kernel shapes). A token's
    NLL is logsumexp(logits) - its logit, each a few float32 ulps off under other shapes, so the NLL is off by a
    few ulps of the logits' size, not its own: up to ~1.3e-6 of it has been seen. 1e-5 (84 float32 ulps) bounds
    that; a real difference (a window scored twice or dropped) moves bits per byte by percents."""
    from raylm.corpus.run import run_corpus

    sweep, out, _, _ = swept
    model, corpus = sweep.models[1], sweep.corpora[0]
    standalone = run_corpus(sweep.corpus_config(model, corpus), tmp_path / "ppl")
    swept_results = json.loads((out / model.name / CORPUS_POINT / "results.json").read_text())
    assert swept_results["config"]["command"] == "ppl" and swept_results["config"]["max_length"] == 32
    ppl = swept_results["results"]["ppl"]
    for figures, expected in [(ppl, standalone.metrics), *((ppl["domains"][d], standalone.metrics["domains"][d])
                                                           for d in ("heading", "paragraph"))]:
        assert {k: figures[k] for k in ("tokens", "words", "bytes", "chars", "docs")} == \
            {k: expected[k] for k in ("tokens", "words", "bytes", "chars", "docs")}
        assert figures["bits_per_byte"] == pytest.approx(expected["bits_per_byte"], rel=FLOAT32_SHAPES)
    assert ppl["macro"]["bits_per_byte"] == pytest.approx(standalone.metrics["macro"]["bits_per_byte"],
                                                          rel=FLOAT32_SHAPES)
    docs = pq.read_table(out / model.name / CORPUS_POINT / "samples" / "ppl.parquet")
    plain = pq.read_table(tmp_path / "ppl" / "samples" / "ppl.parquet")
    assert docs.drop_columns(["nll"]).equals(plain.drop_columns(["nll"]))
    assert docs["nll"].to_pylist() == pytest.approx(plain["nll"].to_pylist(), rel=FLOAT32_SHAPES)


def test_a_corpus_point_whose_corpus_changed_is_rerun(swept):
    """A corpus point is current while its checkpoint's manifest is the one raylm ppl would key it to now: the
    corpus file rewritten is another config, whose point runs afresh."""
    from raylm.sweep.run import corpus_is_current

    sweep, out, _, _ = swept
    model, corpus = sweep.models[0], sweep.corpora[0]
    assert corpus_is_current(sweep, model, corpus, out)
    os.utime(corpus.data, ns=(1, 1))  # the same bytes, another modification time: as a rewritten file
    assert not corpus_is_current(sweep, model, corpus, out)
    assert not (out / model.name / CORPUS_POINT).exists()
    assert list((out / SUPERSEDED_DIR).glob(f"*/{model.name}/{CORPUS_POINT}/results.json"))


BAD = {
    "unknown top key": ("models: [gpt2]\ntasks: [hellaswag]\nsetings: {limit: 3}\n", "line 3: setings: unknown key"),
    "unknown task": ("models: [gpt2]\ntasks:\n  - hellaswag\n  - arc\n", "line 4: tasks: unknown task 'arc'"),
    "bad dtype": ("models:\n  - path: gpt2\n    dtype: fp8\ntasks: [hellaswag]\n",
                  "line 3: models[0].dtype: unknown dtype 'fp8'"),
    "limit zero": ("models: [gpt2]\ntasks: [hellaswag]\nsettings:\n  limit: [5, 0]\n",
                   "line 4: settings.limit: limit must be a number of documents (1, 2, ...) or a fraction"),
    "two quantizations": ("models:\n  - path: gpt2\n    load_in_4bit: true\n    load_in_8bit: true\n"
                          "tasks: [hellaswag]\n",
                          "line 4: models[0].load_in_8bit: conflicts with another quantization"),
    "duplicate name": ("models:\n  - gpt2\n  - path: gpt2\ntasks: [hellaswag]\n",
                       "line 3: models[1].name: 'gpt2' is already used by models[0]"),
    "dtype twice": ("models:\n  - path: gpt2\n    dtype: float32\ntasks: [hellaswag]\nsettings:\n  dtype: [bfloat16]\n",
                    "line 3: models[0].dtype: also given in settings.dtype"),
    "missing tasks": ("models: [gpt2]\n", "line 1: tasks: missing (a sweep file needs 'tasks', 'corpora' or both)"),
    "corpus without data": ("models: [gpt2]\ncorpora:\n  - name: web\n", "line 3: corpora[0].data: missing"),
    "corpus format": ("models: [gpt2]\ncorpora:\n  - {name: web, data: x.bin, format: bin}\n",
                      "line 3: corpora[0].format: unknown format 'bin'"),
    "not yaml": ("models: [gpt2\ntasks: [hellaswag]\n", "line 2: not valid YAML"),
    "bad batch size": ("models: [gpt2]\ntasks: [hellaswag]\nsettings:\n  batch_size: [auto, big]\n",
                       "line 4: settings.batch_size: must be 'auto' or a positive integer, got 'big'"),
    "missing data dir": ("models: [gpt2]\ntasks: [hellaswag]\ndata_dir: nowhere\n", "line 3: data_dir: directory"),
    "max length zero": ("models:\n  - path: gpt2\n    max_length: 0\ntasks: [hellaswag]\n",
                        "line 3: models[0].max_length: must be positive, got 0"),
}


def test_max_length_key_sets_each_models_context(tmp_path):
    """A top-level max_length is every model's default; a model's own key wins (ModelSpec.max_length, HFLM's)."""
    path = tmp_path / "sweep.yaml"
    path.write_text("models:\n  - gpt2\n  - path: EleutherAI/pythia-160m\n    max_length: 512\n"
                    "tasks: [hellaswag]\nmax_length: 256\n")
    assert [m.spec.max_length for m in load_sweep(path).models] == [256, 512]


def test_gen_kwargs_key_reaches_every_points_config(tmp_path):
    """`gen_kwargs` is raylm eval's --gen-kwargs for every model and point; an argument raylm's generation engine
    lacks is refused naming the file."""
    path = tmp_path / "sweep.yaml"
    path.write_text("models: [gpt2]\ntasks: [hellaswag]\ngen_kwargs: {max_gen_toks: 32, temperature: 0.5}\n")
    sweep = load_sweep(path)
    assert sweep.config(sweep.models[0], sweep.points[0]).gen_kwargs == {"max_gen_toks": 32, "temperature": 0.5}
    path.write_text("models: [gpt2]\ntasks: [hellaswag]\ngen_kwargs: {num_beams: 4}\n")
    with pytest.raises(RaylmError, match=rf"^{path}: gen_kwargs: generation argument num_beams=4 is not "):
        load_sweep(path)


def test_a_generation_tasks_filtered_metrics_reach_the_summary():
    """lm-eval reports a generate_until task's metrics under its filters (gsm8k: exact_match,strict-match and
    exact_match,flexible-extract), never under "none"; the summary shows each beside the likelihood tasks'."""
    from raylm.sweep.summary import Row, summary_csv, summary_markdown

    results = {"results": {
        "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1,
                  "exact_match,flexible-extract": 0.5, "exact_match_stderr,flexible-extract": "N/A"},
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.75, "acc_stderr,none": 0.05}}, "config": {}}
    rows = [Row("m", "p", Path("."), results)]
    header = summary_markdown(rows).splitlines()[0]
    assert header == "| model | point | gsm8k exact_match,strict-match | gsm8k exact_match,flexible-extract | " \
                     "arc_easy acc |"
    assert summary_markdown(rows).splitlines()[2] == "| m | p | 0.2500 ± 0.1000 | 0.5000 | 0.7500 ± 0.0500 |"
    assert summary_csv(rows).splitlines()[1].endswith(",0.25,0.1,0.5,,0.75,0.05")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_file_names_line_and_key(tmp_path, case):
    text, expected = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RaylmError) as error:
        load_sweep(path)
    assert str(error.value).startswith(f"{path}: ") and expected in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_reports_a_bad_sweep_file_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD["unknown task"][0])
    proc = run_cli("sweep", str(path), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raylm: error:")]
    assert len(errors) == 1 and "line 4: tasks: unknown task 'arc'" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "out" / "summary.csv").exists()


def test_shipped_sweeps_parse():
    demo = load_sweep(REPO / "jobs" / "demo.yaml")
    assert [(m.name, m.spec.dtype, m.spec.quantization) for m in demo.models] == [
        ("stories260K-fp32", "float32", None), ("stories260K-nf4", "float32", "4bit")]
    assert Path(demo.models[0].spec.path).is_dir() and demo.data_dir is not None and demo.data_dir.is_dir()
    gpu = load_sweep(REPO / "jobs" / "gpu-sweep.yaml")
    assert len(gpu.models) == 10 and {m.spec.quantization for m in gpu.models} == {None, "4bit"}
    assert {m.spec.dtype for m in gpu.models} == {"bfloat16"} and gpu.num_gpus == 0.25
    assert [p.num_fewshot for p in gpu.points] == [0, 5]


def test_num_gpus_flag_reaches_the_actors_config():
    args = build_parser().parse_args(["eval", "--demo", "--num-gpus", "0.25"])
    cfg = config_from_args(args)
    assert cfg.num_gpus == 0.25
    with pytest.raises(RaylmError, match="--num-gpus must be 0 or more"):
        replace(cfg, num_gpus=-1.0).validate()


def test_failed_point_stops_before_summary_and_keeps_finished_points(ray_session, tiny_llama, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"models: [{tiny_llama}]\ntasks: [hellaswag]\ndata_dir: {DATA}\ndevice: cpu\n"
                    "settings:\n  num_fewshot: [0, 1]   # no HellaSwag training split here to draw shots from\n"
                    "  limit: [2]\n")
    sweep = load_sweep(path)
    out = tmp_path / "out"
    with pytest.raises(RaylmError, match=r"^tiny-llama\d*: .*hellaswag/train.jsonl: data file not found"):
        run_sweep(sweep, out)
    name = sweep.models[0].name
    assert (out / name / sweep.points[0].name / "results.json").is_file()
    assert not (out / name / sweep.points[1].name / "results.json").exists()
    assert not (out / "summary.csv").exists() and not (out / "summary.md").exists()
    assert json.loads((out / "sweep.json").read_text())[name]["points_run"] == [sweep.points[0].name]


def demo_sweep(path: Path, tasks: str, extra: str = "") -> Sweep:
    path.write_text(f"models:\n  - path: raylm:demo\n    name: demo\n    dtype: float32\ntasks: {tasks}\n"
                    f"data_dir: raylm:demo\ndevice: cpu\nsettings:\n  limit: [6]\n{extra}")
    return load_sweep(path)


def test_a_point_whose_config_changed_is_rerun_and_its_old_results_kept_aside(ray_session, tmp_path):
    """The issue's reproduction: the same sweep file with a task added, into the same output. The old point held
    only hellaswag; reusing it crashed writing the plots (no samples/winogrande.parquet). Now it is rerun, the
    summary has both tasks, and the old folder is kept under superseded/."""
    out = tmp_path / "out"
    first = run_sweep(demo_sweep(tmp_path / "sweep.yaml", "[hellaswag]"), out)
    point = first["demo"].points_run[0]
    before = json.loads((out / "demo" / point / "results.json").read_text())
    runs = run_sweep(demo_sweep(tmp_path / "sweep.yaml", "[hellaswag, winogrande]"), out)
    assert runs["demo"].points_run == [point] and runs["demo"].loads == 1
    after = json.loads((out / "demo" / point / "results.json").read_text())
    assert set(after["results"]) == {"hellaswag", "winogrande"}
    assert after["results"]["hellaswag"] == before["results"]["hellaswag"]
    assert "winogrande acc" in (out / "summary.csv").read_text().splitlines()[0]
    (aside,) = (out / SUPERSEDED_DIR).glob(f"*/demo/{point}")
    assert json.loads((aside / "results.json").read_text())["results"].keys() == {"hellaswag"}
    again = run_sweep(demo_sweep(tmp_path / "sweep.yaml", "[hellaswag, winogrande]"), out)
    assert again["demo"].points_skipped == [point] and again["demo"].loads == 0  # this config's own: reused
    assert len(list((out / SUPERSEDED_DIR).glob("*/demo/*"))) == 1


class Crash(RuntimeError):
    pass


def test_a_sweep_killed_inside_a_point_resumes_there_with_another_actor_count(ray_session, tmp_path, monkeypatch):
    out = tmp_path / "out"
    sweep = demo_sweep(tmp_path / "sweep.yaml", "[hellaswag, winogrande]", "shard_size: 8\n")
    saved = []

    def crash_after_three_shards(cfg, actors, on_shard=None):
        def hook(shard, scored):
            saved.append(shard.index)
            if len(saved) == 3:
                raise Crash("driver killed")
        return evaluate(cfg, actors, on_shard=hook)

    monkeypatch.setattr(raylm.sweep.run, "evaluate", crash_after_three_shards)
    with pytest.raises(Crash):
        run_sweep(sweep, out)
    monkeypatch.undo()
    point = out / "demo" / sweep.points[0].name
    assert not (point / "results.json").exists() and len(list((point / "checkpoint" / "shards").iterdir())) == 3
    resumed = run_sweep(replace(sweep, actors_per_model=2), out)
    assert resumed["demo"].points_run == [sweep.points[0].name] and len(resumed["demo"].actor_pids) == 2
    results = json.loads((point / "results.json").read_text())
    assert results["config"]["shards_resumed"] == 3 and results["config"]["actors"] == 2
    plain = evaluate(replace(sweep.config(sweep.models[0], sweep.points[0]), num_cpus=1.0))
    assert results["sums"] == {name: task.sums for name, task in plain.tasks.items()}
    resumed_rows = sum(pq.read_table(point / "checkpoint" / "shards" / f"{i:06d}.parquet").num_rows for i in saved)
    assert results["config"]["requests_scored"] + resumed_rows == sum(t.scored.num_rows for t in plain.tasks.values())


def test_failed_models_are_all_named_after_the_summaries_of_the_models_that_finished(ray_session, tmp_path,
                                                                                        monkeypatch):
    from raylm.data.demo import DEMO_MODEL

    for name in ("bad-a", "bad-b"):
        (tmp_path / name).symlink_to(DEMO_MODEL)
    path = tmp_path / "sweep.yaml"
    path.write_text("models:\n  - path: raylm:demo\n    name: demo\n    dtype: float32\n"
                    "  - path: bad-a\n    dtype: float32\n  - path: bad-b\n    dtype: float32\n"
                    "tasks: [hellaswag]\ndata_dir: raylm:demo\ndevice: cpu\nsettings:\n  limit: [4]\n")
    sweep = load_sweep(path)

    def starts(spec, *args, **kwargs):
        if Path(spec.path).name.startswith("bad"):
            raise RaylmError(f"could not load model '{spec.path}': its weights are broken")
        return start_actors(spec, *args, **kwargs)

    monkeypatch.setattr(raylm.sweep.run, "start_actors", starts)
    out = tmp_path / "out"
    with pytest.raises(RaylmError) as raised:
        run_sweep(sweep, out)
    bad = [m.name for m in sweep.models if m.name != "demo"]
    assert str(raised.value) == "; ".join(f"{name}: could not load model '{tmp_path / name.split('-float32')[0]}': "
                                          "its weights are broken" for name in bad) + (
        " (the summaries cover the 1 model(s) that finished)")
    rows = (out / "summary.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("demo,")
    assert (out / "summary.md").is_file() and (out / "metrics.png").is_file()


@pytest.mark.timeout(300)
def test_two_cpu_models_read_parquet_corpora_while_their_actors_hold_every_cpu(ray_session, tiny_llama, tiny_gpt2,
                                                                                tmp_path):
    """Two CPU models with only corpora on the 2-CPU session Ray: both actors would hold a CPU each and Parquet's
    file listing, which asks for a CPU whatever the read asks, would wait for ever. The sweep holds a CPU for its
    reads first, so the models take turns and every corpus point finishes."""
    import pyarrow as pa

    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()][:6]
    (tmp_path / "web").mkdir()
    for i in range(3):
        pq.write_table(pa.table({"text": lines[2 * i:2 * i + 2]}), tmp_path / "web" / f"part-{i}.parquet")
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""\
models:
  - path: {tiny_llama}
    dtype: float32
  - path: {tiny_gpt2}
    dtype: float32
corpora:
  - {{name: web, data: web/*.parquet, max_length: 32}}
device: cpu
""")
    sweep = load_sweep(path)
    runs = run_sweep(sweep, tmp_path / "out")
    for model in sweep.models:
        assert runs[model.name].points_run == ["corpus-web"]
        results = json.loads((tmp_path / "out" / model.name / "corpus-web" / "results.json").read_text())
        assert results["results"]["ppl"]["docs"] == 6
