"""What one evaluation run is asked to do, checked before anything is read or started.

It lives apart from the driver so that parsing a command line or a sweep file never imports Ray or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS
from raylm.tasks import TASKS

if TYPE_CHECKING:
    from raylm.storage.location import Location

# lm-eval's seeds (lm_eval.defaults): Python's `random` 0, numpy, torch and the few-shot sampler 1234.
DEFAULT_RANDOM_SEED = 0
DEFAULT_OTHER_SEED = 1234
DEFAULT_FEWSHOT_SEED = DEFAULT_OTHER_SEED
DEFAULT_BOOTSTRAP_ITERS = 100000  # lm_eval.simple_evaluate's default


def parse_batch_size(value: int | str | None, what: str = "batch_size") -> int | None:
    """lm-eval's batch_size ("auto", "auto:N", N) as raylm's: None fills a token budget, N caps requests per batch.
    The one reading of it for the command line, sweep files and RayLM's model_args.

    lm-eval's HFLM reads auto:N as a schedule: it splits its length-sorted requests into N equal parts and detects
    the largest batch that fits at the start of each. raylm's token budget sizes every batch to its own requests,
    which is auto:N with N as large as the number of batches, so auto:N is raylm's auto; N is checked as HFLM
    reads it (a number above 0: HFLM divides by it)."""
    text = "" if value is None else str(value)
    mode, colon, schedule = text.partition(":")
    if value is None or text == "auto":
        return None
    if mode == "auto" and colon:
        try:
            if float(schedule) > 0:
                return None
        except ValueError:
            pass
        raise RaylmError(f"{what + ' ' if what else ''}auto:N needs N, the times lm-eval re-detects its batch size, "
                         f"to be a number above 0, got {value!r}")
    if not text.isdigit() or int(text) < 1:
        raise RaylmError(f"{what + ' ' if what else ''}must be 'auto' or a positive integer, got {value!r}")
    return int(text)


@dataclass(frozen=True)
class EvalConfig:
    model: ModelSpec
    tasks: tuple[str, ...]  # native names, or any lm-eval task, group, tag or pattern
    data_dir: Path | None = None
    limit: int | float | None = None  # N documents per task, or below 1 a fraction of them (lm-eval's rule)
    num_fewshot: int | None = None  # None: each lm-eval task's own default (native tasks: 0)
    fewshot_seed: int | None = DEFAULT_FEWSHOT_SEED  # the few-shot sampler's (lm-eval's fewshot_random_seed)
    batch_size: int | None = None
    actors: int | None = None
    shard_requests: int = DEFAULT_SHARD_REQUESTS
    progress: bool = True
    output: Path | str | Location | None = None  # checkpoint finished shards here (a local path or a filesystem URI)
    overwrite: bool = False  # discard results a different run left in `output`
    num_gpus: float | None = None
    num_cpus: float | None = None  # CPUs per actor, replacements included (default: the node's CPUs shared out)
    # Seconds actors no node can hold yet are waited for (--placement-timeout; None: raylm.cluster.runtime's default)
    placement_timeout_s: float | None = None
    include_path: Path | None = None  # lm-eval's --include_path: a directory of the user's own task YAMLs
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS
    random_seed: int | None = DEFAULT_RANDOM_SEED  # lm-eval's seeding of Python's, numpy's and torch's generators
    numpy_seed: int | None = DEFAULT_OTHER_SEED
    torch_seed: int | None = DEFAULT_OTHER_SEED
    log_samples: bool = False  # keep lm-eval's per-document samples for samples/<task>_docs.parquet
    # A `raylm contamination` output (directory or its contamination.json): every metric is also computed on the
    # documents it found clean, as `<metric>_decontaminate`.
    decontaminate: Path | None = None
    # lm-eval's --samples: task -> the indices of the documents to evaluate (others run in full), sorted
    samples: dict[str, list[int]] | None = None
    metadata: dict[str, Any] | None = None  # lm-eval's --metadata, handed to its tasks with the model's arguments
    # lm-eval's prompt settings: True (the tokenizer's default template) or a template name; multiturn few-shot
    # (None: on exactly when a chat template is); a system instruction; the template's extra keyword arguments.
    apply_chat_template: bool | str = False
    fewshot_as_multiturn: bool | None = None
    system_instruction: str | None = None
    chat_template_args: dict[str, Any] | None = None
    # lm-eval's --gen_kwargs: merged into every generate_until task's generation_kwargs, as simple_evaluate does
    gen_kwargs: dict[str, Any] | None = None
    # lm-eval's --predict_only: its tasks' metrics replaced by "bypass" (responses kept, nothing scored against the
    # target), their samples logged
    predict_only: bool = False
    # HFLM's enable_thinking (also the chat template's argument; True refuses loglikelihood requests, as HFLM does)
    # and think_end_token (a generation is what follows its last occurrence, as HFLM post-processes it)
    enable_thinking: bool | None = None
    think_end_token: str | None = None
    # lm-eval's --confirm_run_unsafe_code: code tasks' programs run without a sandbox on a node that cannot sandbox
    # (raylm.sandbox.policy); where a node can, they run in its sandbox whatever this says
    confirm_run_unsafe_code: bool = False

    def __post_init__(self) -> None:
        # lm-eval evaluates --samples documents in file order whatever order they are listed in, and labels each
        # by its place in the list; sorted, the label is the document's own index (the same documents either way).
        if isinstance(self.samples, dict):
            object.__setattr__(self, "samples", {
                k: sorted(v) if isinstance(v, list) and all(isinstance(i, int) for i in v) else v
                for k, v in self.samples.items()})

    @property
    def lmeval_tasks(self) -> tuple[str, ...]:
        """The names lm-eval resolves: every name raylm does not implement natively."""
        return tuple(name for name in self.tasks if name not in TASKS)

    @property
    def multiturn(self) -> bool:
        """lm-eval's CLI default: few-shot examples as turns whenever a chat template is applied."""
        return bool(self.apply_chat_template) if self.fewshot_as_multiturn is None else self.fewshot_as_multiturn

    @property
    def chat_template_name(self) -> str | None:
        return self.apply_chat_template if isinstance(self.apply_chat_template, str) else None

    @property
    def seeds(self) -> tuple[int | None, int | None, int | None, int | None]:
        """lm-eval's four seeds: random, numpy, torch, few-shot."""
        return self.random_seed, self.numpy_seed, self.torch_seed, self.fewshot_seed

    def _check_thinking(self) -> None:
        """HFLM's rules: enable_thinking=True needs think_end_token (its __init__), and no loglikelihood request
        may be scored with it (its loglikelihood(); lm-eval's tasks are checked once built, in
        raylm.tasks.lmeval.build). A token id raylm cannot strip by: it strips on the generated text."""
        if self.enable_thinking and self.think_end_token is None:
            raise RaylmError("--model_args enable_thinking=True needs think_end_token (as HFLM requires), e.g. "
                             "think_end_token=</think>")
        if self.think_end_token is not None and not isinstance(self.think_end_token, str):
            raise RaylmError(f"--model_args think_end_token={self.think_end_token!r} is a token id; raylm strips the "
                             "thinking from the generated text, so give the token's text (think_end_token=</think>)")
        if self.enable_thinking:
            choice = [name for name in self.tasks if name in TASKS and TASKS[name].kind == "multiple_choice"]
            if choice:
                raise RaylmError(f"enable_thinking=True is not compatible with loglikelihood tasks (HFLM refuses it "
                                 f"too); triggered by task(s): {', '.join(choice)}")

    def validate(self) -> None:
        if not self.tasks:
            raise RaylmError("no tasks given")
        if self.lmeval_tasks:
            from raylm.tasks.lmeval.extra import require_lm_eval

            require_lm_eval(self.lmeval_tasks)
        if self.include_path is not None:
            if not self.include_path.is_dir():
                raise RaylmError(f"--include-path '{self.include_path}' is not a directory")
            from raylm.tasks.lmeval.extra import require_lm_eval_for_include_path

            require_lm_eval_for_include_path()
        if self.bootstrap_iters < 0:
            raise RaylmError(f"--bootstrap-iters must be 0 or more, got {self.bootstrap_iters}")
        check_limit(self.limit)
        if self.samples is not None:
            check_samples(self.samples, self.limit)
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise RaylmError("--fewshot-as-multiturn needs --apply-chat-template (as in lm-eval)")
        if self.predict_only:
            native = [name for name in self.tasks if name in TASKS]
            if native:
                raise RaylmError(f"--predict_only applies to lm-eval tasks; {', '.join(native)} "
                                 f"{'is a' if len(native) == 1 else 'are'} raylm native task(s), whose metrics "
                                 "raylm computes: run them without it")
            if not self.log_samples:
                raise RaylmError("--predict_only keeps only the samples: it needs log_samples (as lm-eval forces)")
        if self.chat_template_args and not self.apply_chat_template:
            raise RaylmError("chat_template_args apply only with --apply-chat-template")
        self._check_thinking()
        if self.gen_kwargs:
            from raylm.requests.generation import check_gen_kwargs

            check_gen_kwargs(self.gen_kwargs, "gen_kwargs")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise RaylmError(f"--num-fewshot must be 0 or more, got {self.num_fewshot}")
        if self.actors is not None and self.actors < 1:
            raise RaylmError(f"--actors must be at least 1, got {self.actors}")
        if self.batch_size is not None and self.batch_size < 1:
            raise RaylmError(f"--batch-size must be 'auto' or a positive integer, got {self.batch_size}")
        if self.shard_requests < 1:
            raise RaylmError(f"shard size must be at least 1, got {self.shard_requests}")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise RaylmError(f"--num-gpus must be 0 or more, got {self.num_gpus}")
        if self.decontaminate is not None and not self.decontaminate.exists():
            raise RaylmError(f"--decontaminate '{self.decontaminate}' does not exist (a `raylm contamination` "
                             "output directory, or its contamination.json)")
        if self.num_cpus is not None and self.num_cpus <= 0:
            raise RaylmError(f"CPUs per actor must be more than 0, got {self.num_cpus}")
        self.model.validate()


def check_limit(limit: int | float | None, what: str = "--limit") -> None:
    """lm-eval reads a limit below 1 as a fraction of each task's documents (ceil(n * limit)), else as a count;
    a count that is not whole (lm-eval truncates 2.5 to 2) is refused, as is anything not above 0."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0 or \
            (limit >= 1 and not float(limit).is_integer()):
        raise RaylmError(f"{what} must be a number of documents (1, 2, ...) or a fraction of them below 1 "
                         f"(0.1 = 10%), got {limit!r}")


def check_samples(samples: Any, limit: int | float | None) -> None:
    """lm-eval's --samples: a mapping of task name to document indices, not combined with --limit."""
    if limit is not None:
        raise RaylmError("--samples and --limit cannot be combined (as in lm-eval)")
    if not isinstance(samples, dict) or not samples:
        raise RaylmError("--samples must map task names to lists of document indices, e.g. {\"arc_easy\": [0, 3]}")
    for task, indices in samples.items():
        if not isinstance(indices, list) or not indices or \
                not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
            raise RaylmError(f"--samples: {task} must list document indices (integers 0 or more), got {indices!r}")
        if len(set(indices)) != len(indices):
            raise RaylmError(f"--samples: {task} lists a document more than once")
