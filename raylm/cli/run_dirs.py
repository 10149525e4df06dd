"""Where a command writes when it is not told: one folder per model and per run's settings, so that commands with
other models, tasks or settings sit side by side instead of refusing each other's checkpoints, and the same command
line finds its own folder again and resumes.

A folder's name is a function of the command line's settings alone (a readable label, then a short digest of every
setting that can change the results), never of the data, the installed libraries or the time: it is known before
any model loads, and a rerun maps to it even when the data changed, where the checkpoint's own manifest then
refuses the changed data as it refuses any other difference."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from raylm.models.spec import ModelSpec
from raylm.storage.location import has_wildcards, is_uri, split_query

if TYPE_CHECKING:  # the corpus and membership runs import Ray; a folder name needs none of it
    from raylm.config import EvalConfig
    from raylm.contamination.membership_run import MembershipConfig
    from raylm.corpus.run import CorpusConfig

DEFAULT_ROOT = Path("raylm-out")
DIGEST_CHARS = 10
LABEL_CHARS = 60  # a long task list is cut; the digest still tells runs apart
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
# EvalConfig's fields that leave the results as they are, or say only where they go (--log-samples adds samples to
# the same results, so a rerun with it resumes and adds them).
EVAL_UNKEYED = frozenset({"output", "overwrite", "batch_size", "actors", "num_gpus", "num_cpus", "progress",
                          "placement_timeout_s", "log_samples"})
# CorpusConfig's and MembershipConfig's (--docs-per-batch is keyed: it moves float32 numbers by a rounding).
CORPUS_UNKEYED = frozenset({"actors", "progress", "placement_timeout_s", "overwrite", "checkpoint_every_s"})


def model_folder(spec: ModelSpec) -> str:
    """The model as a folder name: a local directory's own name, or a hub id as lm-eval names it (org__name)."""
    return _name(spec.path) or "model"


def _name(path: str) -> str:
    return _safe(Path(path).name if os.path.isabs(path) else path.replace("/", "__"))


def settings(config: Any, skip: frozenset[str]) -> dict[str, Any]:
    """A run config's fields as the folder is keyed to them, less `skip`: the fields that leave the results as
    they are (actor count, batch size, progress bars, where the output goes)."""
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name not in skip}


def run_dir(root: Path | str, command: str, label: list[str], keyed: dict[str, Any]) -> Path | str:
    """`root/<label>-<digest>`, `root` a local path or a URI (its query kept last); the digest covers the command
    and `keyed`."""
    text = json.dumps({"command": command, **keyed}, sort_keys=True, default=_plain)
    digest = hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
    name = _safe("-".join(p for p in label if p))[:LABEL_CHARS].strip("-.+_")  # no hidden folder
    leaf = f"{name}-{digest}" if name else digest
    if isinstance(root, str) and is_uri(root):
        base, query = split_query(root)
        return f"{base.rstrip('/')}/{leaf}" + (f"?{query}" if query else "")
    return Path(root) / leaf


def eval_dir(cfg: EvalConfig, root: Path | str | None = None) -> Path | str:
    """`raylm eval`'s folder: under `root` (lm-eval's --output_path layout gives one), else raylm-out/<model>."""
    label = [*([_name(cfg.model.peft)] if cfg.model.peft else []), tasks_label(cfg.tasks),
             *([f"{cfg.num_fewshot}shot"] if cfg.num_fewshot is not None else []),
             *([f"limit{cfg.limit}"] if cfg.limit is not None else [])]
    return run_dir(DEFAULT_ROOT / model_folder(cfg.model) if root is None else root, "eval", label,
                   settings(cfg, EVAL_UNKEYED))


def corpus_dir(cfg: CorpusConfig) -> Path | str:
    """`raylm ppl`'s and `raylm kl`'s folder: raylm-out/<model>/ppl-<data>-<digest> (kl-<model b>-<data>-...)."""
    label = [cfg.kind, *([_name(cfg.model_b.path)] if cfg.model_b is not None else []), data_label(cfg.data)]
    return run_dir(DEFAULT_ROOT / model_folder(cfg.model), cfg.kind, label, settings(cfg, CORPUS_UNKEYED))


def membership_dir(cfg: MembershipConfig) -> Path | str:
    """`raylm membership`'s folder: raylm-out/<model>/membership-<tasks>-<digest>."""
    return run_dir(DEFAULT_ROOT / model_folder(cfg.model), "membership", ["membership", tasks_label(cfg.tasks)],
                   settings(cfg, CORPUS_UNKEYED))


def tasks_label(tasks: tuple[str, ...] | list[str]) -> str:
    return "+".join(PurePath(t).stem if t.endswith((".yaml", ".yml")) else t for t in tasks)


def data_label(data: str) -> str:
    """A corpus argument's last plain path component ('corpus/*.parquet' -> 'corpus')."""
    path = split_query(data)[0] if is_uri(data) else data
    parts = [p for p in path.replace("\\", "/").split("/") if p and not has_wildcards(p)]
    return parts[-1] if parts else "data"


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_")


def _plain(value: Any) -> Any:
    """JSON for what run configs hold besides JSON's own types: a local path by its absolute form (a rerun from
    the same folder with `./data` or `data` is the same run), a model spec by its fields. Anything else is a
    TypeError, never a repr that could hold a memory address and so change from run to run."""
    if isinstance(value, PurePath):
        return os.path.abspath(value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not a setting a folder name can be keyed to")
