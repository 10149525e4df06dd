"""lm-eval's tasks loaded and their requests built, as lm_eval.simple_evaluate / evaluate do it, model call aside.

Each function mirrors the glue lm-eval runs around its model call and says which. The order is lm-eval's and
it matters: seed the global generators, then load the tasks (a task's process_docs may draw from Python's
`random`: gpqa shuffles its choices), then set num_fewshot and the few-shot seed, then build the requests once,
in task order (the few-shot samplers are stateful, drawing document by document).

The global generators are the process's, so all of this runs under LMEVAL_LOCK: two runs in one process (a
sweep's models run side by side on threads) would otherwise interleave their draws.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from lm_eval.evaluator_utils import get_sample_size
from lm_eval.tasks.manager import TaskDict

from raylm.errors import RaylmError
from raylm.tasks.lmeval.names import Selection, refuse_output_type
from raylm.tasks.lmeval.nltk_data import require_punkt_tab
from raylm.tasks.prompt import PLAIN, PromptFormat

LMEVAL_LOCK = threading.RLock()


@dataclass(frozen=True)
class Request:
    """One lm-eval Instance as raylm scores it: where its score goes back, and the strings to score."""

    task: str
    doc_id: int
    idx: int
    request_type: str  # "loglikelihood" (multiple-choice requests too), "loglikelihood_rolling" or "generate_until"
    arguments: tuple[Any, ...]  # (context, continuation), (text,) for rolling, (context, gen_kwargs) to generate
    repeats: int = 1  # evaluate() sends a request to the model this many times (a sampled generation differs each)


@dataclass
class Built:
    """Loaded tasks whose Instances are built, and the per-task limit and --samples indices evaluate() keeps for
    post-processing."""

    tasks: TaskDict
    limits: dict[str, int | None]
    samples: dict[str, list[int]] | None = None

    def indices(self, task: str) -> list[int] | None:
        """The --samples indices of a task (evaluate()'s `samples.get(task_name, None)`), or None: all of it."""
        return self.samples.get(task) if self.samples is not None else None

    def requests(self, task: str) -> list[Request]:
        return [Request(task, inst.doc_id, inst.idx, inst.request_type, inst.args, inst.repeats or 1)
                for inst in self.tasks["tasks"][task].instances]

    def output_type(self, task: str) -> str:
        return self.tasks["tasks"][task].OUTPUT_TYPE


def seed_globals(random_seed: int | None, numpy_seed: int | None, torch_seed: int | None) -> None:
    """simple_evaluate's seeding (evaluator.py, `if random_seed is not None: random.seed(...)` through
    `set_torch_seed`), done before tasks load because a task's process_docs may draw from these generators."""
    if random_seed is not None:
        random.seed(random_seed)
    if numpy_seed is not None:
        np.random.seed(numpy_seed)
    if torch_seed is not None:
        from lm_eval.utils import set_torch_seed

        set_torch_seed(torch_seed)


def load(selection: Selection) -> TaskDict:
    """TaskManager.load of the expanded names (the datasets are read here), after refusing a group that holds a
    task twice, and any task of a type raylm does not run, and once IFEval's nltk data is found
    (raylm.tasks.lmeval.nltk_data). Code tasks' `evaluate.load("code_eval")` is raylm's sandboxed, offline one
    (raylm.tasks.lmeval.code_eval), and this node must be able to sandbox, or be allowed not to
    (raylm.sandbox.policy). Call seed_globals first."""
    from raylm.sandbox.policy import sandboxed_here
    from raylm.tasks.lmeval.code_eval import offline_code_eval

    require_punkt_tab(selection.manager, selection.leaves)
    try:
        with offline_code_eval(selection.unsafe_code):
            loaded = selection.manager.load(selection.names)
    except ValueError as e:
        if str(e).startswith("Duplicate task"):
            raise RaylmError(f"lm-eval: {e}") from e
        raise
    for name, task in loaded["tasks"].items():
        refuse_output_type(name, task.OUTPUT_TYPE, "")
        if getattr(task, "MULTIMODAL", False):
            raise RaylmError(f"lm-eval task '{name}' is multimodal; raylm scores text only")
    if any(getattr(task, "UNSAFE_CODE", False) for task in loaded["tasks"].values()):
        sandboxed_here(selection.unsafe_code)
    return loaded


def configure(loaded: TaskDict, num_fewshot: int | None, fewshot_seed: int | None,
              gen_kwargs: dict[str, Any] | None = None, predict_only: bool = False) -> None:
    """simple_evaluate's per-task overrides (evaluator.py, the `for task_name, task_obj in loaded["tasks"]` loop:
    gen_kwargs, predict_only, num_fewshot and `task_obj.set_fewshot_seed`): --gen_kwargs update a generate_until
    task's generation_kwargs; --predict_only replaces every metric by lm-eval's "bypass" (before the requests are
    built: a metric such as acc_mutual_info adds requests of its own); --num-fewshot wins unless the task pins 0;
    unset keeps the task's default, or 0 where it has none; every task's sampler is re-seeded with the few-shot
    seed."""
    for task in loaded["tasks"].values():
        if gen_kwargs and task.get_config("output_type") == "generate_until":
            task.set_config(key="generation_kwargs", value=gen_kwargs, update=True)
        if predict_only:
            task.override_metric(metric_name="bypass")
        if num_fewshot is not None:
            if task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=fewshot_seed)


def build(loaded: TaskDict, limit: int | float | None, samples: dict[str, list[int]] | None = None,
          prompt: PromptFormat = PLAIN) -> Built:
    """evaluate()'s request building (evaluator.py, the `for task_name, task in eval_tasks.items()` loop:
    get_sample_size, which reads a limit below 1 as a fraction of each task's documents, then build_all_requests
    with the task's --samples indices, system instruction and chat template), on one rank, no request cache.
    Call once per configure(): the few-shot samplers advance with every document."""
    if prompt.thinking:
        refuse_loglikelihood(loaded)
    limits: dict[str, int | None] = {}
    with cached_templates():
        for name, task in loaded["tasks"].items():
            limits[name] = get_sample_size(task, limit)
            indices = samples.get(name) if samples is not None else None
            if indices:
                _check_indices(name, indices, len(task.eval_docs))
            task.build_all_requests(limit=limits[name], samples=indices, rank=0, world_size=1,
                                    cache_requests=False, rewrite_requests_cache=False,
                                    system_instruction=prompt.system_instruction,
                                    apply_chat_template=prompt.chat_template is not None,
                                    fewshot_as_multiturn=prompt.fewshot_as_multiturn,
                                    chat_template=prompt.chat_template, tokenizer_name="")
    return Built(loaded, limits, samples)


def refuse_loglikelihood(loaded: TaskDict) -> None:
    """HFLM.loglikelihood under enable_thinking=True (the requests of loglikelihood and multiple-choice tasks; it
    scores rolling ones), before any request is built."""
    names = sorted(name for name, task in loaded["tasks"].items()
                   if task.OUTPUT_TYPE in ("loglikelihood", "multiple_choice"))
    if names:
        raise RaylmError("enable_thinking=True is not compatible with loglikelihood tasks (HFLM refuses it too); "
                         f"triggered by task(s): {', '.join(names)}")


def documents(task: Any, limit: int | None, samples: list[int] | None = None) -> Iterator[tuple[int, int, dict]]:
    """(doc_id, index, doc) for each document evaluate() scores, in its order: doc_id as lm-eval numbers it, which
    its Instances and so raylm's scores carry (0..k-1 under --samples, which lm-eval renumbers), and index, the
    document's own place in the task, which a contamination scan and a logged sample name it by. lm-eval keeps
    --samples documents in file order, so the k-th is the k-th smallest index. `limit` is a document count."""
    chosen = sorted(samples) if samples else None
    for doc_id, doc in task.doc_iterator(rank=0, limit=limit, world_size=1, samples=samples):
        yield doc_id, chosen[doc_id] if chosen else doc_id, doc


def _check_indices(task: str, indices: list[int], n_docs: int) -> None:
    """lm-eval asserts this in doc_iterator; here it is a one-line error before any scoring."""
    bad = [i for i in indices if not 0 <= i < n_docs]
    if bad:
        raise RaylmError(f"--samples: {task} has {n_docs} documents; index {bad[0]} is out of range")


def load_and_build(selection: Selection, seeds: Sequence[int | None], num_fewshot: int | None,
                   limit: int | float | None, samples: dict[str, list[int]] | None = None,
                   prompt: PromptFormat = PLAIN, gen_kwargs: dict[str, Any] | None = None,
                   predict_only: bool = False) -> Built:
    """The whole of it, in lm-eval's order, for seeds (random, numpy, torch, few-shot)."""
    with LMEVAL_LOCK:
        seed_globals(*seeds[:3])
        loaded = load(selection)
        configure(loaded, num_fewshot, seeds[3], gen_kwargs, predict_only)
        return build(loaded, limit, samples, prompt)


@contextlib.contextmanager
def cached_templates() -> Iterator[None]:
    """lm-eval compiles a Jinja template on every doc_to_text/target/choice call (utils.apply_template): most of
    its request-building time (10-21 s for 5-shot MMLU on 6 subjects here, 0.3-0.7 s cached). Within this block
    each distinct template string is compiled once, by lm-eval's own Jinja environment, so the text is the same.
    Hold LMEVAL_LOCK: the module attribute is swapped for the block's duration."""
    import lm_eval.utils as lm_utils

    original = lm_utils.apply_template
    compiled: dict[str, Any] = {}

    def apply_template(template: str, doc: dict) -> str:
        if template not in compiled:
            compiled[template] = lm_utils.env.from_string(template)
        return compiled[template].render(**doc)

    lm_utils.apply_template = apply_template
    try:
        yield
    finally:
        lm_utils.apply_template = original
