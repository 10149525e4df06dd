"""What one evaluation run is asked to do, checked before anything is read or started.

It lives apart from the driver so that parsing a command line or a sweep file never imports Ray or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raylm.errors import RaylmError
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS
from raylm.scoring.models import ModelSpec
from raylm.tasks import get_task

DEFAULT_FEWSHOT_SEED = 1234  # lm-eval's default fewshot_random_seed


@dataclass(frozen=True)
class EvalConfig:
    model: ModelSpec
    tasks: tuple[str, ...]
    data_dir: Path | None = None
    limit: int | None = None
    num_fewshot: int = 0
    seed: int = DEFAULT_FEWSHOT_SEED
    batch_size: int | None = None
    actors: int | None = None
    shard_requests: int = DEFAULT_SHARD_REQUESTS
    progress: bool = True
    output: Path | None = None  # checkpoint finished shards here and resume from them
    overwrite: bool = False  # discard results a different run left in `output`
    num_gpus: float | None = None
    num_cpus: float | None = None  # CPUs per actor, replacements included (default: the node's CPUs shared out)

    def validate(self) -> None:
        for name in self.tasks:
            get_task(name)
        if not self.tasks:
            raise RaylmError("no tasks given")
        if self.limit is not None and self.limit < 1:
            raise RaylmError(f"--limit must be a positive number of documents, got {self.limit}")
        if self.num_fewshot < 0:
            raise RaylmError(f"--num-fewshot must be 0 or more, got {self.num_fewshot}")
        if self.actors is not None and self.actors < 1:
            raise RaylmError(f"--actors must be at least 1, got {self.actors}")
        if self.batch_size is not None and self.batch_size < 1:
            raise RaylmError(f"--batch-size must be 'auto' or a positive integer, got {self.batch_size}")
        if self.shard_requests < 1:
            raise RaylmError(f"shard size must be at least 1, got {self.shard_requests}")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise RaylmError(f"--num-gpus must be 0 or more, got {self.num_gpus}")
        if self.num_cpus is not None and self.num_cpus <= 0:
            raise RaylmError(f"CPUs per actor must be more than 0, got {self.num_cpus}")
        self.model.validate()
