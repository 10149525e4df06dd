"""lm-eval's code-execution tasks (humaneval, mbpp and their variants) on offline mirrors of their datasets
(tests/code_tasks.py): pass@k as HF code_eval's estimator computes it, raylm's results for fixed generations equal to
lm-eval's own evaluator around a model answering with the same texts, each program's outcome equal to the program
run directly, and sampled generations that do not depend on the number of actors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import lm_eval
import numpy as np
import pyarrow as pa
import pytest
from code_tasks import SOLUTIONS, WRONG, write_code_tasks
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable
from test_generation_tasks import SEEDS, ReplayLM, scored_generations

from raylm.results.lmeval import results, task_scores
from raylm.tasks.lmeval.build import LMEVAL_LOCK, documents, load_and_build
from raylm.tasks.lmeval.code_eval import (
    CODE_EVAL,
    estimate_pass_at_k,
    offline_code_eval,
)
from raylm.tasks.lmeval.names import select

# What a fixed generation does to its program: a correct completion, a wrong one, and two that raise.
KINDS = ("solution", "wrong", "raises", "syntax")


@pytest.fixture(scope="module")
def code_tasks(tmp_path_factory):
    out = tmp_path_factory.mktemp("code-tasks")
    write_code_tasks(out)
    return out


def test_pass_at_k_is_the_closed_form_for_every_n_above_k():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        c = int(rng.integers(0, n + 1))
        k = int(rng.integers(1, n + 1))
        closed = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert estimate_pass_at_k([n], [c], k)[0] == pytest.approx(closed, abs=1e-12), (n, c, k)
    assert estimate_pass_at_k([10, 10], [0, 10], 3).tolist() == [0.0, 1.0]


def completion(task: str, doc: dict, problem: int, kind: str) -> str:
    """A generation for `task`'s document: HumanEval's continue the prompt's function, MBPP's write the whole
    function."""
    body = {"solution": SOLUTIONS[problem], "wrong": WRONG[problem], "raises": "    raise ValueError('no')\n",
            "syntax": "    return (\n"}[kind]
    if task.startswith("humaneval"):
        return body
    return doc["code"].split("\n")[0] + "\n" + body  # cut before its stop string, [DONE]


def fixed_generations(built) -> dict[tuple[str, int, int, int], str]:
    out = {}
    for task in built.tasks["tasks"]:
        obj = built.tasks["tasks"][task]
        docs = {doc_id: doc for doc_id, _, doc in documents(obj, built.limits[task], built.indices(task))}
        for r in built.requests(task):
            for repeat in range(r.repeats):
                kind = KINDS[(r.doc_id + repeat + len(task)) % len(KINDS)]
                out[(task, r.doc_id, r.idx, repeat)] = completion(task, docs[r.doc_id], r.doc_id, kind)
    return out


def ran_directly(program: str) -> bool:
    """The program as HF code_eval judges it, run here without any sandbox: passed when it exits cleanly."""
    return subprocess.run([sys.executable, "-c", program], check=False, capture_output=True,
                          timeout=30).returncode == 0


def test_code_task_results_are_lm_evals_own_and_each_outcome_is_the_program_run_directly(code_tasks, sandboxed):
    names = ["humaneval_local", "humaneval_plus_local", "mbpp_local", "mbpp_plus_local"]
    built = load_and_build(select(names, code_tasks), SEEDS, None, None)
    texts = fixed_generations(built)
    scores, arguments = {}, {}
    for task in built.tasks["tasks"]:
        for r in built.requests(task):
            arguments[(task, r.doc_id, r.idx)] = r.arguments
        scores.update(task_scores(task, "generate_until", pa.table({}), scored_generations(texts, task)))
    CODE_EVAL.outcomes.clear()
    ours = results(built, scores, 0)
    CODE_EVAL.outcomes.clear()  # lm-eval's evaluator runs every program again, one document at a time
    with LMEVAL_LOCK, offline_code_eval(unsafe_allowed=False):
        theirs = lm_eval.simple_evaluate(model=ReplayLM(texts, scores, arguments), tasks=names, bootstrap_iters=0,
                                         task_manager=TaskManager(include_path=str(code_tasks),
                                                                  include_defaults=False),
                                         confirm_run_unsafe_code=True, random_seed=SEEDS[0],
                                         numpy_random_seed=SEEDS[1], torch_random_seed=SEEDS[2],
                                         fewshot_random_seed=SEEDS[3])
    logged = {task: [{k: v for k, v in s.items() if k != "programs"} for s in samples]
              for task, samples in ours["samples"].items()}
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples"):
        assert json.dumps(ours.get(key), default=handle_non_serializable) == \
            json.dumps(theirs.get(key), default=handle_non_serializable), key
    assert json.dumps(logged, default=handle_non_serializable) == \
        json.dumps(theirs["samples"], default=handle_non_serializable)
    for task, samples in ours["samples"].items():
        passed = []
        for sample in samples:
            candidates = sample["filtered_resps"][0]
            programs = [c + "\n" + sample["target"] for c in (candidates if isinstance(candidates, list)
                                                               else [candidates])]
            direct = [ran_directly(p) for p in programs]
            assert [p["passed"] for p in sample["programs"]] == direct
            assert {p["outcome"] for p in sample["programs"]} <= {"passed", "failed"}
            passed.append(float(np.mean(direct)))
        (metric,) = [k for k in ours["results"][task] if k.startswith("pass") and "stderr" not in k]
        assert ours["results"][task][metric] == pytest.approx(np.mean(passed))
        assert 0 < np.mean(passed) < 1, task  # the fixed generations pass some problems and fail others


def test_sampled_generations_are_the_same_on_one_or_two_actors_and_their_programs_run_on_ray(
        ray_session, tiny_gpt2, code_tasks, sandboxed):
    """humaneval_64's sampling (4 samples a problem here): every sample seeded by (seed, document, repeat), so two
    actors with another batch size draw the same texts; the programs run on Ray CPU tasks once the actors are
    gone, each with its outcome logged."""
    from raylm.config import EvalConfig
    from raylm.evaluate import evaluate
    from raylm.models.spec import ModelSpec

    spec = ModelSpec(str(tiny_gpt2), dtype="float32", device="cpu")
    runs = []
    for actors, batch_size in ((1, 1), (2, 3)):
        cfg = EvalConfig(spec, ("humaneval_4_local",), include_path=code_tasks, limit=2, actors=actors,
                         batch_size=batch_size, shard_requests=1, progress=False, log_samples=True,
                         bootstrap_iters=0, gen_kwargs={"max_gen_toks": 6})
        runs.append(evaluate(cfg).lmeval)
    one, two = ([s["resps"] for s in run["samples"]["humaneval_4_local"]] for run in runs)
    assert one == two
    texts = [text for resps in one for text in resps[0]]
    assert len(texts) == 8 and len(set(texts)) > 2  # sampled: the repeats differ
    for sample in runs[1]["samples"]["humaneval_4_local"]:
        assert [p["outcome"] for p in sample["programs"]] == ["failed"] * 4  # a random model's code
    assert runs[0]["results"]["humaneval_4_local"]["pass@2,create_test"] == 0.0


def test_a_node_that_cannot_sandbox_refuses_code_tasks_at_load_unless_unsafe_code_is_confirmed(
        code_tasks, tmp_path, monkeypatch, caplog):
    """lm-eval's code utils check at load that code can run; on a node without bubblewrap that check is raylm's
    one-line refusal, before any model work; --confirm_run_unsafe_code runs the programs unsandboxed, warning."""
    from raylm.errors import RaylmError
    from raylm.sandbox.bubblewrap import sandbox_unavailable

    sandbox_unavailable.cache_clear()
    CODE_EVAL.outcomes.clear()  # so that the programs below run here, unsandboxed, not answered from earlier runs
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    try:
        with pytest.raises(RaylmError, match=r"needs bubblewrap .*--confirm_run_unsafe_code") as refused:
            load_and_build(select(["humaneval_local"], code_tasks), SEEDS, None, 1)
        assert "\n" not in str(refused.value)
        selection = select(["humaneval_local"], code_tasks)
        selection.unsafe_code = True
        built = load_and_build(selection, SEEDS, None, None)
        texts = {key: SOLUTIONS[key[1]] for key in fixed_generations(built)}
        scores = task_scores("humaneval_local", "generate_until", pa.table({}),
                             scored_generations(texts, "humaneval_local"))
        CODE_EVAL.outcomes.clear()
        ours = results(built, scores, 0)
    finally:
        sandbox_unavailable.cache_clear()
    assert ours["results"]["humaneval_local"]["pass@1,create_test"] == 1.0
    assert "WITHOUT a sandbox" in caplog.text


def test_hostile_programs_are_failed_samples_and_the_run_finishes(code_tasks, tmp_path, monkeypatch, sandboxed):
    """Completions that attack the node, each after a correct solution so that it would pass were it not
    contained: every one is a failed sample with its outcome logged, nothing reaches the host, the run finishes."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-secret")
    escaped = tmp_path / "escaped"
    attacks = {  # top-level code after the completed function, before the tests
        "loops": "while True:\n    pass\n",
        "allocates 6 GiB": "hoard = bytearray(6 << 30)\n",
        "reads the caller's credentials": "import os\nassert os.environ['AWS_SECRET_ACCESS_KEY'] == 'caller-secret'\n",
        "connects out": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1).close()\n",
        "writes to $HOME and /tmp": f"open({str(home / 'pwned')!r}, 'w').write('x')\n",
        "writes to the host": f"import pathlib\npathlib.Path({str(escaped)!r}).write_text('x')\n",
        "kills its parent, then fails": "import posix\nposix.kill(posix.getppid(), 9)\nraise SystemExit(1)\n",
        "forks": "import posix\nposix.fork()\nraise SystemExit(1)\n",
    }
    built = load_and_build(select(["humaneval_4_local"], code_tasks), SEEDS, None, 2)
    kinds = list(attacks)
    texts = {key: SOLUTIONS[key[1]] + attacks[kinds[(key[1] * 4 + key[3]) % len(kinds)]]
             for key in fixed_generations(built)}
    scores = task_scores("humaneval_4_local", "generate_until", pa.table({}),
                         scored_generations(texts, "humaneval_4_local"))
    CODE_EVAL.outcomes.clear()
    ours = results(built, scores, 0)
    outcomes = {kinds[(s["doc_id"] * 4 + r) % len(kinds)]: (p["outcome"], p["detail"])
                for s in ours["samples"]["humaneval_4_local"] for r, p in enumerate(s["programs"])}
    assert set(outcomes) == set(attacks), outcomes
    # a busy loop meets its 3 s of CPU and its 3 s of wall time together: either stops it
    assert outcomes["loops"] in {("timed out", "wall time"), ("killed by a limit", "cpu time")}
    assert outcomes["allocates 6 GiB"] == ("killed by a limit", "memory")
    assert all(outcome in ("failed", "killed by a limit") for kind, (outcome, _) in outcomes.items()
               if kind != "loops"), outcomes
    assert ours["results"]["humaneval_4_local"]["pass@2,create_test"] == 0.0
    assert not (home / "pwned").exists() and not escaped.exists()
