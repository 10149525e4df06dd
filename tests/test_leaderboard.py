"""The Open LLM Leaderboard v2 (`--tasks leaderboard`, lm-eval's own YAMLs unchanged) against lm-eval 0.4.13's own
run of it (tests/golden/lmeval-0.4.13_leaderboard.json.xz, made by tests/golden/make_leaderboard.py): IFEval, the
24 BBH tasks, GPQA's three, MATH-hard's seven, MuSR's three and MMLU-Pro, on the offline mirror of
tests/leaderboard_mirror.py, as a chat model's multiturn run, 2 documents per task, 8 new tokens.

raylm's run goes through its real pieces in-process (the code `raylm eval` runs, without Ray): lm-eval's tasks
built and tokenised as the driver does (raylm.requests.lmeval.build_lmeval_requests), scored and generated on a
ResidentScorer (what an actor holds), and lm-eval's metrics computed by raylm.results.lmeval. Every prompt (by lm-eval's hash, the first document's in full),
every request's arguments, every generation and filtered response exactly, every loglikelihood within the golden
README's tolerance, every per-document metric, and every task and group metric equal lm-eval's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from fixture_data import read_golden

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))

from leaderboard_mirror import write_mirror
from make_leaderboard import OUT, leaderboard_dir

from raylm.config import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

GOLDEN = read_golden(OUT.name.removesuffix(".xz"))
SEEDS = (DEFAULT_RANDOM_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED)
LOGLIK_ABS, LOGLIK_REL = 2e-4, 2e-6  # tests/golden/README.md


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The mirror as HF_DATASETS_CACHE and NLTK_DATA: `datasets` and nltk read those variables once, at import, so
    their module-level settings are patched for this module."""
    import datasets.config
    import nltk

    cache, nltk_data = write_mirror(tmp_path_factory.mktemp("leaderboard-mirror"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(nltk.data, "path", [str(nltk_data)])
        patch.setenv("NLTK_DATA", str(nltk_data))
        yield cache, nltk_data


@pytest.fixture(scope="module")
def ours(mirror, tmp_path_factory) -> dict:
    """raylm's run of the golden's settings, in-process."""
    import parity_fixtures as fx

    from raylm.cli.lmeval import parse_pairs
    from raylm.cluster.actors import ResidentScorer
    from raylm.models.spec import ModelSpec
    from raylm.requests.driver import driver_encoder, driver_sampling, prompt_format
    from raylm.requests.lmeval import build_lmeval_requests
    from raylm.requests.shards import LMEVAL_KIND
    from raylm.results.lmeval import results, task_scores
    from raylm.tasks.lmeval.names import select

    s = GOLDEN["settings"]
    spec = ModelSpec(str(fx.chat_model(tmp_path_factory.mktemp("chat") / "chat", fx.LLAMA3_STYLE)),
                     dtype=s["dtype"], device=s["device"])
    encoder = driver_encoder(spec)
    prompt = prompt_format(encoder.tokenizer, apply_chat_template=s["apply_chat_template"],
                           multiturn=s["fewshot_as_multiturn"])
    built, tables = build_lmeval_requests(select(s["tasks"], leaderboard_dir()), encoder, prompt, tasks=s["tasks"],
                                          seeds=SEEDS, limit=s["limit"], sampling=lambda: driver_sampling(spec),
                                          gen_kwargs=parse_pairs([s["gen_kwargs"]], "--gen_kwargs"))
    scorer = ResidentScorer(spec, threads=1, batch_size=None)
    scores = {}
    for name, (_, table) in tables.items():
        scores.update(task_scores(name, built.output_type(name), table, scorer.score(LMEVAL_KIND, table).table))
    return json.loads(json.dumps(results(built, scores, s["bootstrap_iters"]), default=str))  # as the golden


def close(a, b) -> bool:
    """Equal, but floats (loglikelihoods) within the golden README's tolerance, through lists and tuples."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=LOGLIK_REL, abs_tol=LOGLIK_ABS)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


def test_the_golden_is_the_whole_leaderboard_group():
    assert set(GOLDEN["groups"]) == {"leaderboard", "leaderboard_bbh", "leaderboard_gpqa", "leaderboard_math_hard",
                                     "leaderboard_musr"}
    tasks = set(GOLDEN["results"]) - set(GOLDEN["groups"])
    assert len(tasks) == 1 + 24 + 3 + 7 + 3 + 1 and {"leaderboard_ifeval", "leaderboard_mmlu_pro"} <= tasks
    assert all(n == {"original": n["original"], "effective": 2} for n in GOLDEN["n-samples"].values())


@pytest.mark.slow
def test_every_prompt_generation_response_and_document_metric_is_lm_evals(ours):
    from lm_eval.utils import hash_string

    assert set(ours["samples"]) == set(GOLDEN["samples"])
    for task, docs in GOLDEN["samples"].items():
        mine = {(s["doc_id"], s["filter"]): s for s in ours["samples"][task]}
        assert {d for d, _ in mine} == {d["doc_id"] for d in docs}, task
        for theirs in docs:
            for key, filtered in theirs["filters"].items():
                s, where = mine[(theirs["doc_id"], key)], (task, theirs["doc_id"], key)
                assert s["prompt_hash"] == theirs["prompt_hash"] and s["target"] == theirs["target"], where
                assert [list(a[1:]) for a in s["arguments"]] == theirs["arguments"], where
                if theirs["doc_id"] == docs[0]["doc_id"]:
                    assert [a[0] for a in s["arguments"]] == GOLDEN["contexts"][task], where
                assert hash_string(s["arguments"][0][0]) == theirs["prompt_hash"], where
                if isinstance(theirs["resps"][0][0], str):  # generations: exactly
                    assert s["resps"] == theirs["resps"] and s["filtered_resps"] == filtered["filtered_resps"], where
                else:  # (loglikelihood, is_greedy) per choice
                    assert close(s["resps"], theirs["resps"]), where
                    assert close(s["filtered_resps"], filtered["filtered_resps"]), where
                assert {m: s[m] for m in filtered if m != "filtered_resps"} == \
                    {m: v for m, v in filtered.items() if m != "filtered_resps"}, where


@pytest.mark.slow
def test_every_task_and_group_metric_is_lm_evals(ours):
    for section in ("results", "groups"):
        assert set(ours[section]) == set(GOLDEN[section]), section
        for name, metrics in GOLDEN[section].items():
            assert set(ours[section][name]) == set(metrics), (section, name)
            for key, value in metrics.items():
                mine = ours[section][name][key]
                if isinstance(value, float) and "stderr" in key:
                    assert mine == pytest.approx(value, rel=1e-6), (section, name, key)
                else:
                    assert mine == value, (section, name, key)
    for section in ("group_subtasks", "n-shot", "n-samples", "higher_is_better"):
        assert ours[section] == GOLDEN[section], section


def test_a_missing_punkt_tab_stops_an_ifeval_run_in_one_line_before_its_code_loads(mirror, tmp_path, monkeypatch):
    """IFEval's code downloads punkt_tab when imported and, without a network, loads anyway and fails at scoring;
    raylm looks on nltk's data path first. Offline, it says what is missing and how to get it; online, it
    downloads it as lm-eval would, and a failed download says the same. Tasks without IFEval do not look."""
    import nltk

    from raylm.errors import RaylmError
    from raylm.tasks.lmeval.build import load
    from raylm.tasks.lmeval.names import select
    from raylm.tasks.lmeval.nltk_data import ifeval_tasks

    empty = tmp_path / "nltk_data"
    monkeypatch.setattr(nltk.data, "path", [str(empty)])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    selection = select(["leaderboard"], leaderboard_dir())
    assert ifeval_tasks(selection.manager, selection.leaves) == ["leaderboard_ifeval"]
    how = r"download it where there is a network with python -c \"import nltk; nltk.download\('punkt_tab', " \
          r"download_dir=DIR\)\", then set NLTK_DATA=DIR$"
    with pytest.raises(RaylmError, match=rf"^leaderboard_ifeval needs nltk's punkt_tab \(tokenizers/punkt_tab\), "
                                         rf"which is not on nltk's data path \({empty}\) and cannot be downloaded "
                                         rf"offline: {how}"):
        load(selection)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def no_network(*args, **kwargs):
        raise ValueError("Error loading punkt_tab: <urlopen error [Errno -3]\nTemporary failure in name resolution>")

    monkeypatch.setattr(nltk, "download", no_network)
    with pytest.raises(RaylmError, match=r"and could not be downloaded \(Error loading punkt_tab: <urlopen error "
                                         rf"\[Errno -3\] Temporary failure in name resolution>\): {how}") as raised:
        load(select(["leaderboard_ifeval"], leaderboard_dir()))
    assert "\n" not in str(raised.value)
    assert load(select(["leaderboard_musr"], leaderboard_dir()))["tasks"]  # no IFEval: nltk is not asked


def test_ifevals_language_checks_are_seeded(mirror, monkeypatch):
    """langdetect draws a new seed for every text unless DetectorFactory.seed is set, and on a short text its
    answer depends on it; raylm's metrics run with seed 0 whatever it was before (docs/switching-from-lm-eval.md),
    so an IFEval score does not change from one run to the next."""
    import pyarrow as pa
    from langdetect import DetectorFactory, detect

    from raylm.results.lmeval import results, task_scores
    from raylm.tasks.lmeval.build import load_and_build
    from raylm.tasks.lmeval.names import select

    text, task = "Hello world", "leaderboard_ifeval"  # document 0 asks for English and no commas
    answers = {}
    for seed in range(8):
        monkeypatch.setattr(DetectorFactory, "seed", seed)
        answers[seed] = detect(text)
    assert answers[0] == "en" and "nl" in answers.values()
    monkeypatch.setattr(DetectorFactory, "seed", next(s for s, lang in answers.items() if lang != "en"))
    built = load_and_build(select([task], leaderboard_dir()), SEEDS, None, 1)
    generated = pa.table({"doc_id": pa.array([0], pa.int64()), "req_idx": pa.array([0], pa.int32()),
                          "repeat": pa.array([0], pa.int32()), "generation": [text],
                          "generated_tokens": pa.array([2], pa.int32()), "context_tokens": pa.array([7], pa.int32())})
    out = results(built, task_scores(task, "generate_until", pa.table({}), generated), 0)
    assert out["samples"][task][0]["inst_level_strict_acc"] == [True, True]
    assert out["results"][task]["prompt_level_strict_acc,none"] == 1.0
