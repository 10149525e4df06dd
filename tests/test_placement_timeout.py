"""--placement-timeout: actors no node of the session's 2-CPU Ray can hold (a GPU actor, which an autoscaler might
add a node for) stop `raylm eval`, a sweep and `raylm ppl` with one line once the given wait is over, instead of
after the fixed 600 s the wait was."""

from __future__ import annotations

import pytest

import raylm.cluster.runtime as runtime
from raylm.cli import parse_args
from raylm.cli.sweep import run_sweep_file
from raylm.config import EvalConfig
from raylm.corpus.run import CorpusConfig, run_corpus
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.models.spec import ModelSpec
from raylm.sweep.config import load_sweep

GPU_DEMO = ModelSpec(str(DEMO_MODEL), "float32", "cuda")  # the session Ray has no GPU, and its growth is unknown


@pytest.fixture
def quick_polls(monkeypatch):
    monkeypatch.setattr(runtime, "READY_POLL_S", 0.2)


def test_eval_waits_for_an_unplaceable_actor_as_long_as_placement_timeout_says(ray_session, quick_polls):
    cfg = EvalConfig(GPU_DEMO, ("winogrande",), DEMO_DATA, limit=2, progress=False, placement_timeout_s=1.5)
    with pytest.raises(RaylmError, match=r"^cannot place 1 of 1 scoring actor\(s\) asking for 0.5 CPU and 1 GPU each: "
                                         r".*; waited 1.5 s \(") as err:
        evaluate(cfg)
    assert "\n" not in str(err.value)
    args = parse_args(["eval", "--demo", "--placement-timeout", "1.5"])
    assert args.placement_timeout == 1.5
    with pytest.raises(SystemExit):
        parse_args(["eval", "--demo", "--placement-timeout", "0"])


def test_a_sweeps_placement_timeout_from_its_file_or_the_flag(ray_session, quick_polls, tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"models: [{DEMO_MODEL}]\ntasks: [winogrande]\ndata_dir: {DEMO_DATA}\ndevice: cuda\n"
                          "settings: {limit: [2]}\nplacement_timeout: 1.5\n")
    assert load_sweep(sweep_file).placement_timeout == 1.5
    with pytest.raises(RaylmError, match=r"asking for 0.5 CPU and 1 GPU each: .*; waited 1 s \("):
        run_sweep_file(parse_args(["sweep", str(sweep_file), "--output", str(tmp_path / "out"),
                                   "--placement-timeout", "1"]))


def test_ppl_stops_when_its_actors_do_not_start_within_placement_timeout(ray_restarted_after, tmp_path):
    """Ray Data leaves the failed stream's pending actor behind while the driver lives (a CLI run ends with it):
    the session Ray is restarted after this module."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one short document\nand another\n")
    cfg = CorpusConfig(GPU_DEMO, str(corpus), progress=False, placement_timeout_s=1.5)
    with pytest.raises(RaylmError, match=r"^1 model actor\(s\) asking for 0.5 CPU and 1 GPU each did not all start "
                                         r"within --placement-timeout 1.5 s") as err:
        run_corpus(cfg, tmp_path / "out")
    assert "\n" not in str(err.value)
