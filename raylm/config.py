"""What one evaluation run is asked to do, checked before anything is read or started.

It lives apart from the driver so that parsing a command line or a sweep file never imports Ray or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS
from raylm.tasks import TASKS

# lm-eval's seeds (lm_eval.defaults): Python's `random` 0, numpy, torch and the few-shot sampler 1234.
DEFAULT_RANDOM_SEED = 0
DEFAULT_OTHER_SEED = 1234
DEFAULT_FEWSHOT_SEED = DEFAULT_OTHER_SEED
DEFAULT_BOOTSTRAP_ITERS = 100000  # lm_eval.simple_evaluate's default


def parse_batch_size(value: int | str | None, what: str = "batch_size") -> int | None:
    """lm-eval's batch_size ("auto", "auto:N", N) as raylm's: None fills a token budget, N caps requests per batch.
    The one reading of it for the command line, sweep files and RayLM's model_args."""
    if value is None or str(value).startswith("auto"):
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise RaylmError(f"{what + ' ' if what else ''}must be 'auto' or a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class EvalConfig:
    model: ModelSpec
    tasks: tuple[str, ...]  # native names, or any lm-eval task, group, tag or pattern
    data_dir: Path | None = None
    limit: int | None = None
    num_fewshot: int | None = None  # None: each lm-eval task's own default (native tasks: 0)
    fewshot_seed: int | None = DEFAULT_FEWSHOT_SEED  # the few-shot sampler's (lm-eval's fewshot_random_seed)
    batch_size: int | None = None
    actors: int | None = None
    shard_requests: int = DEFAULT_SHARD_REQUESTS
    progress: bool = True
    output: Path | None = None  # checkpoint finished shards here and resume from them
    overwrite: bool = False  # discard results a different run left in `output`
    num_gpus: float | None = None
    num_cpus: float | None = None  # CPUs per actor, replacements included (default: the node's CPUs shared out)
    include_path: Path | None = None  # lm-eval's --include_path: a directory of the user's own task YAMLs
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS
    random_seed: int | None = DEFAULT_RANDOM_SEED  # lm-eval's seeding of Python's, numpy's and torch's generators
    numpy_seed: int | None = DEFAULT_OTHER_SEED
    torch_seed: int | None = DEFAULT_OTHER_SEED
    log_samples: bool = False  # keep lm-eval's per-document samples for samples/<task>_docs.parquet
    # A `raylm contamination` output (directory or its contamination.json): every metric is also computed on the
    # documents it found clean, as `<metric>_decontaminate`.
    decontaminate: Path | None = None

    @property
    def lmeval_tasks(self) -> tuple[str, ...]:
        """The names lm-eval resolves: every name raylm does not implement natively."""
        return tuple(name for name in self.tasks if name not in TASKS)

    @property
    def seeds(self) -> tuple[int | None, int | None, int | None, int | None]:
        """lm-eval's four seeds: random, numpy, torch, few-shot."""
        return self.random_seed, self.numpy_seed, self.torch_seed, self.fewshot_seed

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
        if self.limit is not None and self.limit < 1:
            raise RaylmError(f"--limit must be a positive number of documents, got {self.limit}")
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
