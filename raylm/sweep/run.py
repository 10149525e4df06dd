"""Running a sweep: one model-resident actor per model, which runs every point for that model before release.

Each model gets a driver thread that starts its actor(s), evaluates its points one after another on them, then
scores the sweep's corpora on the same actors (raylm.corpus.resident: each corpus a point of its own, a
`raylm ppl --output` folder `corpus-<name>`), and kills them; Ray places the actors, so models run side by side
as far as GPUs (or CPUs) allow and queue otherwise. Each point is a `raylm eval --output` folder of its own: it
checkpoints its shards there, so a killed sweep resumes inside the point it was in, with any number of actors. A
point is skipped only when its folder holds this very config's finished results (point_is_current,
corpus_is_current), and a model with nothing left to run is never loaded.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from raylm.cluster.checkpoint import Checkpoint
from raylm.cluster.runtime import (
    actor_pids,
    connect,
    cpu_share,
    import_transformers,
    kill,
    reserved_for_reading,
    set_batch_size,
    start_actors,
    wants_gpu,
)
from raylm.config import EvalConfig
from raylm.corpus import READ_CPUS
from raylm.errors import RaylmError, RemoteError, first_line
from raylm.evaluate import evaluate, run_fingerprint
from raylm.models.identity import pin_revision
from raylm.models.spec import check_model_path
from raylm.results.contamination import scan_digest
from raylm.results.report import write_results, write_samples
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location, prepare_output
from raylm.storage.lock import output_lock
from raylm.storage.ownership import CHECKPOINT_DIR, RESULTS
from raylm.sweep.config import Sweep, SweepCorpus, SweepModel, SweepPoint
from raylm.sweep.plots import CORPORA_PNG, METRICS_PNG, plot_corpora, plot_metrics, plot_norm_scores
from raylm.sweep.summary import SUMMARY_CSV, SUMMARY_MD, collect, collect_corpora, summary_csv, summary_markdown
from raylm.tasks import TASKS, get_task

if TYPE_CHECKING:
    from raylm.cluster.runtime import ReadingGroup

log = logging.getLogger(__name__)

SUPERSEDED_DIR = "superseded"  # under the sweep's output: point folders of earlier configs, kept aside


@dataclass
class ModelRun:
    """What happened to one model in this invocation: how often it was loaded, by which processes, for what."""

    loads: int = 0
    actor_pids: list[int] = field(default_factory=list)
    points_run: list[str] = field(default_factory=list)
    points_skipped: list[str] = field(default_factory=list)


def point_dir(out: Location, model: SweepModel, point: SweepPoint | str) -> Location:
    return out / model.name / (point if isinstance(point, str) else point.name)


def run_sweep(sweep: Sweep, out: str | os.PathLike[str] | Location) -> dict[str, ModelRun]:
    """Run every point whose results are not this sweep's, then write the summaries and plots over all points.

    A model that fails does not stop the others: the summaries and plots cover the models that finished, and then
    one error names every model that failed. The sweep's output directory is locked for the run, and each point's
    while it is judged and run."""
    out = prepare_output(out)
    with output_lock(out):
        for model in sweep.models:
            check_model_path(model.spec)
        # Pinned once, so that the points judged current and the points run are judged and run on one commit.
        sweep = replace(sweep, models=tuple(replace(m, spec=pin_revision(m.spec)) for m in sweep.models))
        runs = {m.name: ModelRun() for m in sweep.models}
        todo: dict[str, tuple[list[SweepPoint], list[SweepCorpus]]] = {}
        for model in sweep.models:
            for point in sweep.points:
                if point_is_current(sweep, model, point, out):
                    runs[model.name].points_skipped.append(point.name)
                else:
                    todo.setdefault(model.name, ([], []))[0].append(point)
            for corpus in sweep.corpora:
                if corpus_is_current(sweep, model, corpus, out):
                    runs[model.name].points_skipped.append(corpus.point)
                else:
                    todo.setdefault(model.name, ([], []))[1].append(corpus)
        failures = _run_models(sweep, todo, out, runs) if todo else {}
        _write_manifest(out, runs)
        finished = tuple(m for m in sweep.models if m.name not in failures)
        if finished:
            write_reports(replace(sweep, models=finished), out)
        if failures:
            raise _failed(failures, len(finished))
    return runs


def _failed(failures: dict[str, BaseException], finished: int) -> BaseException:
    """One error naming every failed model. An error that is no RaylmError (a bug) is raised as itself for its
    traceback, the others' names and errors logged."""
    for name, error in failures.items():
        log.error("sweep: %s failed: %s", name, first_line(error))
    bug = next((e for e in failures.values() if not isinstance(e, RaylmError)), None)
    if bug is not None:
        return bug
    line = "; ".join(f"{name}: {error}" for name, error in failures.items())
    if finished:
        line += f" (the summaries cover the {finished} model(s) that finished)"
    remote = {name: e for name, e in failures.items() if isinstance(e, RemoteError)}
    if remote:
        return RemoteError(line, "\n".join(f"{name}:\n{e.traceback}" for name, e in remote.items()))
    return RaylmError(line)


def point_is_current(sweep: Sweep, model: SweepModel, point: SweepPoint, out: str | os.PathLike[str] | Location,
                     dry: bool = False) -> bool:
    """Whether the point's folder holds this sweep's finished results: its results.json, and a checkpoint
    manifest equal to the fingerprint `raylm eval` would give this point now (model commit or weight digest,
    tasks, the request tables, settings, seeds, include path, versions, code).

    A folder holding another config's results (a task added, data or weights changed, raylm upgraded) is moved
    aside to OUT/superseded/<time>/<model>/<point> and the point runs afresh, so no summary mixes two configs;
    a folder holding a checkpoint of this very config resumes from it. Files raylm did not write are refused,
    as by `raylm eval`. `dry` (a dry run's judgement) moves nothing and takes no lock."""
    out = location(out)

    def finished(results: Location) -> bool:
        # The shards are this run's; the metrics also depend on the scan --decontaminate reads, which no shard
        # does: results of another scan are recomputed from the checkpoint, which the rerun resumes whole.
        return results.is_file() and _scan_of(results) == scan_digest(sweep.decontaminate)

    return _is_current(out, model, point.name,
                       lambda where: Checkpoint(where, run_fingerprint(point_config(sweep, model, point, out, None))),
                       finished, dry)


def corpus_is_current(sweep: Sweep, model: SweepModel, corpus: SweepCorpus,
                      out: str | os.PathLike[str] | Location, dry: bool = False) -> bool:
    """point_is_current for a corpus point: its results.json, and a checkpoint manifest equal to the one `raylm ppl`
    keys this corpus run to now (model, data files, options, versions, code); another config's folder is moved
    aside, and a checkpoint of this one resumes."""

    def checkpoint_of(where: Location) -> Checkpoint:
        from raylm.corpus.run import plan_corpus  # torch and the scorers: only a sweep with corpora needs them

        return Checkpoint(where, plan_corpus(sweep.corpus_config(model, corpus)).manifest, command="ppl")

    return _is_current(location(out), model, corpus.point, checkpoint_of, Location.is_file, dry)


def _is_current(out: Location, model: SweepModel, point: str, checkpoint_of: Callable[[Location], Checkpoint],
                finished: Callable[[Location], bool], dry: bool = False) -> bool:
    """The judgement both kinds of point share: nothing there runs the point; raylm's files of this very config
    are current when `finished(results.json)`; files raylm did not write are refused; another config's are
    moved aside (unless `dry`: then neither moved nor locked)."""
    where = point_dir(out, model, point)
    if not (where / RESULTS).exists() and not (where / CHECKPOINT_DIR).exists():
        return False
    with output_lock(where) if not dry else nullcontext():
        checkpoint = checkpoint_of(where)
        try:
            checkpoint.refuse_foreign()
        except RaylmError as e:
            raise RaylmError(f"{model.name} / {point}: {e}") from e
        differs = checkpoint.differences()
        if not differs:
            return finished(where / RESULTS)
    if not dry:
        _supersede(out, model, point, differs)
    return False


def _supersede(out: Location, model: SweepModel, point: str, differs: list[str]) -> None:
    aside = out / SUPERSEDED_DIR / time.strftime("%Y%m%dT%H%M%S") / model.name / point
    point_dir(out, model, point).move(aside)
    log.warning("sweep: %s / %s holds results of another config (differs in: %s); moved them to %s and running "
                "the point afresh", model.name, point, ", ".join(differs), aside)


def _scan_of(results: Location) -> str | None:
    """The contamination scan a point's results.json was decontaminated with (None: none)."""
    try:
        recorded = json.loads(results.read_bytes()).get("decontamination")
    except (OSError, ValueError):
        return None
    return recorded.get("scan_sha256") if isinstance(recorded, dict) else None


def point_config(sweep: Sweep, model: SweepModel, point: SweepPoint, out: Location, num_cpus: float | None
                 ) -> EvalConfig:
    """The point as `raylm eval` runs it, checkpointing into its own folder."""
    return replace(sweep.config(model, point), num_cpus=num_cpus, output=point_dir(out, model, point))


def _run_models(sweep: Sweep, todo: dict[str, tuple[list[SweepPoint], list[SweepCorpus]]], out: Location,
                runs: dict[str, ModelRun]) -> dict[str, BaseException]:
    """Every model's unfinished points, models side by side; a failing model does not stop the others. Returns
    each failed model's error."""
    connect()
    # The corpora are read while the models' actors hold their CPUs: the reads get CPUs of their own first.
    read_cpus = READ_CPUS if any(corpora for _, corpora in todo.values()) else None
    with reserved_for_reading(read_cpus) as reading:
        num_cpus = _cpus_per_actor(sweep, len(todo), read_cpus or 0.0)
        models = {m.name: m for m in sweep.models}
        import_transformers()  # before the models' threads start (see there)
        with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="sweep") as pool:
            futures = {name: pool.submit(_run_model, sweep, models[name], points, corpora, out, runs[name],
                                         num_cpus, reading)
                       for name, (points, corpora) in todo.items()}
    return {name: f.exception() for name, f in futures.items() if f.exception() is not None}


def _cpus_per_actor(sweep: Sweep, models: int, reserve: float) -> float | None:
    """CPU actors of different models share the machine's CPUs but `reserve` (else the first would claim them
    all and the models would run one after another); GPU actors keep runtime's fractional-CPU default."""
    if sweep.num_cpus is not None:
        return sweep.num_cpus
    if all(wants_gpu(m.spec, sweep.num_gpus) for m in sweep.models):
        return None
    return float(cpu_share(models * sweep.actors_per_model, reserve))


def _run_model(sweep: Sweep, model: SweepModel, points: list[SweepPoint], corpora: list[SweepCorpus], out: Location,
               run: ModelRun, num_cpus: float | None, reading: ReadingGroup | None) -> None:
    actors = start_actors(model.spec, sweep.actors_per_model, None, sweep.num_gpus, num_cpus,
                          sweep.placement_timeout)
    run.loads += len(actors)
    try:
        run.actor_pids = actor_pids(actors)
        for point in points:
            set_batch_size(actors, point.batch_size)
            where = point_dir(out, model, point)
            with output_lock(where):
                result = evaluate(point_config(sweep, model, point, out, num_cpus), actors)
                result.extra["sweep"] = {"file": str(sweep.source), "model": model.name, "point": point.name,
                                         "actor_pids": run.actor_pids}
                # results.json marks a finished point, so it is written last.
                write_samples(where, result)
                write_results(where, result)
            run.points_run.append(point.name)
            log.info("sweep: %s / %s done", model.name, point.name)
        set_batch_size(actors, None)  # a corpus's token budget is the model's, as in raylm ppl
        from raylm.corpus.run import run_corpus  # see corpus_is_current

        for corpus in corpora:
            run_corpus(sweep.corpus_config(model, corpus), point_dir(out, model, corpus.point), actors, reading)
            run.points_run.append(corpus.point)
            log.info("sweep: %s / %s done", model.name, corpus.point)
    finally:
        kill(actors)


def write_reports(sweep: Sweep, out: Location) -> list[Location]:
    """summary.csv, summary.md, metrics.png and a score histogram per native multiple-choice task over all task
    points, and corpora.png over the corpus points."""
    rows, corpus_rows = collect(sweep, out), collect_corpora(sweep, out)
    paths = [out / SUMMARY_CSV, out / SUMMARY_MD]
    write_atomic(paths[0], summary_csv(rows, corpus_rows).encode())
    write_atomic(paths[1], summary_markdown(rows, corpus_rows).encode())
    if rows:
        paths.append(out / METRICS_PNG)
        plot_metrics(sweep, rows, paths[-1])
    if corpus_rows:
        paths.append(out / CORPORA_PNG)
        plot_corpora(sweep, corpus_rows, paths[-1])
    for task in sweep.tasks:
        if task in TASKS and get_task(task).kind == "multiple_choice":  # native: its requests carry norm_len
            paths.append(out / f"{task}_norm_scores.png")
            plot_norm_scores(task, rows, paths[-1])
    return paths


def _write_manifest(out: Location, runs: dict[str, ModelRun]) -> None:
    """sweep.json: per model, the loads and actor processes of this invocation (the proof of one load each)."""
    data = {name: vars(run) for name, run in runs.items()}
    write_atomic(out / "sweep.json", json.dumps(data, indent=2).encode())
