"""HF evaluate's `code_eval` metric as lm-eval's code tasks call it, answered offline from sandboxed programs.

lm-eval's humaneval and mbpp utils call `evaluate.load("code_eval")` when their YAML is read: a download of the
metric's script from the Hub, which then runs every candidate program in the evaluating process. While raylm loads
tasks, that one name resolves to `CODE_EVAL` instead (`offline_code_eval`); lm-eval's own metric functions
(`pass_at_k`, `pass_at_1`), filters and aggregation run unchanged and call its `compute` with HF's signature.

`compute` builds each program as HF's does (candidate, a newline, the test) and answers pass@k by HF's unbiased
estimator (Chen et al. 2021) over the programs' outcomes. The outcomes come from `recorded`: results() first asks
every document's metric once with the programs only recorded, runs them all at once (on Ray CPU tasks beside the
model's actors, raylm.cluster.programs), then asks again with the outcomes known. A program asked for outside that
(lm-eval's import-time check that code can run) is run here, at once, under the same sandbox.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raylm.sandbox.policy import run_checked
from raylm.sandbox.programs import Limits, Outcome

log = logging.getLogger(__name__)

HF_TIMEOUT_S = 3.0  # code_eval.compute's default timeout, which lm-eval's utils leave as it is
RunPrograms = Callable[[Sequence[tuple[str, Limits]], bool], list[Outcome]]


def estimate_pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> np.ndarray:
    """code_eval's estimator, per problem: 1 - C(n-c, k) / C(n, k), as the product HF computes it in (stable
    for n in the hundreds), and 1 where fewer than k samples fail."""
    def one(n: int, c: int) -> float:
        if n - c < k:
            return 1.0
        return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    return np.array([one(int(n), int(c)) for n, c in zip(num_samples, num_correct)])


def run_here(programs: Sequence[tuple[str, Limits]], unsafe_allowed: bool) -> list[Outcome]:
    """Each program in turn in this process's sandbox: where Ray is not in use (tests, the import-time check)."""
    return [run_checked(source, limits, unsafe_allowed) for source, limits in programs]


@dataclass
class CodeEval:
    """The object lm-eval's utils hold as `compute_` / `pass_at_k`. One per process: lm-eval's utils modules are
    executed afresh at every task load and each asks `evaluate.load` again."""

    unsafe_allowed: bool = False  # --confirm_run_unsafe_code: run without the sandbox where a node cannot sandbox
    outcomes: dict[tuple[str, float], Outcome] = field(default_factory=dict)
    recording: list[tuple[str, float]] | None = None  # (program, timeout) pairs asked for while recording
    last: list[list[dict[str, Any]]] = field(default_factory=list)  # the latest compute's per-sample outcomes
    lock: threading.RLock = field(default_factory=threading.RLock)

    def compute(self, predictions: Sequence[Sequence[str]], references: Sequence[str],
                k: Sequence[int] = (1, 10, 100), num_workers: int = 4, timeout: float = HF_TIMEOUT_S
                ) -> tuple[dict[str, float], dict[int, list[tuple[int, dict[str, Any]]]]]:
        """code_eval.compute's arguments and return: ({"pass@k": mean over problems}, per problem the
        (completion_id, result) pairs, result's `passed` and `result` as HF reports them). `num_workers` is HF's
        thread count; raylm's parallelism is Ray's."""
        programs = [[(candidate + "\n" + test, timeout) for candidate in candidates]
                    for candidates, test in zip(predictions, references)]
        if self.recording is not None:
            self.recording.extend(p for row in programs for p in row)
            return {f"pass@{n}": 0.0 for n in _ks(k)}, {}
        missing = [p for row in programs for p in row if p not in self.outcomes]
        for program, outcome in zip(missing, run_here([(s, limits_for(t)) for s, t in missing],
                                                      self.unsafe_allowed)):
            self.outcomes[program] = outcome
        results: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for task_id, row in enumerate(programs):
            results[task_id] = [(completion_id, result(task_id, completion_id, self.outcomes[p]))
                                for completion_id, p in enumerate(row)]
        self.last = [[r for _, r in results[task_id]] for task_id in sorted(results)]
        total = np.array([len(row) for row in programs])
        correct = np.array([sum(self.outcomes[p].passed for p in row) for row in programs])
        return {f"pass@{n}": float(estimate_pass_at_k(total, correct, n).mean())
                for n in _ks(k) if (total >= n).all()}, results

    def run_recorded(self, record: Callable[[], None], run: RunPrograms) -> None:
        """`record` asks every document's metric with its programs only recorded; they are then run by `run`
        (all at once) and their outcomes kept for the asking that follows."""
        with self.lock:
            self.recording = []
            try:
                record()
                todo = list(dict.fromkeys(p for p in self.recording if p not in self.outcomes))
            finally:
                self.recording = None
            ran = run([(source, limits_for(timeout)) for source, timeout in todo], self.unsafe_allowed)
            self.outcomes.update(zip(todo, ran))


def _ks(k: Sequence[int] | int) -> list[int]:
    return [k] if isinstance(k, int) else list(k)


def limits_for(timeout: float) -> Limits:
    """The sandbox's limits for a program under code_eval's `timeout` (its wall time; the CPU limit rounded up)."""
    return Limits(wall_s=float(timeout), cpu_s=max(1, int(np.ceil(timeout))))


def result(task_id: int, completion_id: int, outcome: Outcome) -> dict[str, Any]:
    """code_eval's per-program result (`passed`, and `result`: "passed", "timed out" or "failed: <error>"), with
    raylm's outcome beside it: passed, failed, timed out or killed by a limit, and its one-line detail."""
    text = "passed" if outcome.passed else "timed out" if outcome.status == "timed out" else \
        f"failed: {outcome.detail or outcome.status}"
    return {"task_id": task_id, "completion_id": completion_id, "passed": outcome.passed, "result": text,
            "outcome": outcome.status, "detail": outcome.detail}


CODE_EVAL = CodeEval()


@contextlib.contextmanager
def offline_code_eval(unsafe_allowed: bool) -> Iterator[None]:
    """`evaluate.load("code_eval")` answers CODE_EVAL while lm-eval reads task YAMLs; other names load as ever.
    Hold LMEVAL_LOCK: the module attribute is swapped for the block's duration."""
    import evaluate

    original = evaluate.load

    def load(path: str, *args: Any, **kwargs: Any) -> Any:
        return CODE_EVAL if path == "code_eval" else original(path, *args, **kwargs)

    CODE_EVAL.unsafe_allowed = unsafe_allowed
    evaluate.load = load
    try:
        yield
    finally:
        evaluate.load = original
