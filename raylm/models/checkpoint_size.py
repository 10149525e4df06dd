"""The parameters a checkpoint stores, summed from its safetensors headers: what sizes a run's work where the
checkpoint's files are on this machine (a local directory, or a hub model in the Hugging Face cache).

Counting from the config instead builds the model on the meta device, which imports its modeling code: on a
2-core machine that is seconds of CPU taken from the actor loading the same model beside it. A header is a few
kilobytes. The two agree where the checkpoint stores each parameter once and nothing else, as save_pretrained
writes it; an older checkpoint that also stores buffers or both ends of a tied weight counts those too (GPT-2 on
the hub stores its attention masks: 137M for its 124M parameters), an over-estimate of the work, never an under-
one. A checkpoint holding anything but floating-point tensors (packed quantised weights count several parameters
per element) is not counted here, nor is one with pickle weights only. A file whose header cannot be read stops
the run in one line naming it, before any actor is asked to load it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from raylm.errors import RaylmError, first_line
from raylm.models.spec import ModelSpec, looks_local, model_source

# transformers' names for a checkpoint's one file and a sharded one's index (SAFE_WEIGHTS_NAME and
# SAFE_WEIGHTS_INDEX_NAME), spelled out so that counting imports nothing of it.
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def stored_parameters(spec: ModelSpec) -> int | None:
    """The elements of every tensor the checkpoint's safetensors files hold; None where those files are not all on
    this machine or hold a tensor that is not floating-point."""
    files = _weight_files(_finder(spec))
    if files is None:
        return None
    from safetensors import SafetensorError, safe_open

    total = 0
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    tensor = f.get_slice(name)
                    if tensor.get_dtype() not in FLOATING:
                        return None
                    total += math.prod(tensor.get_shape())
        except SafetensorError as e:
            # A download cut short, most often: every actor would fail to load it, so the run stops before any.
            raise RaylmError(f"model weights '{path}' cannot be read: {first_line(e)}") from e
    return total


def _finder(spec: ModelSpec) -> Callable[[str], Path | None]:
    """A file of the checkpoint by name, where it is on this machine: in the model's directory, or in the Hugging
    Face cache at the spec's revision (the driver pins it to a commit)."""
    if looks_local(spec.path):
        folder = Path(model_source(spec))
        return lambda name: folder / name if (folder / name).is_file() else None
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> Path | None:
        hit = try_to_load_from_cache(spec.path, name, revision=spec.revision)
        return Path(hit) if isinstance(hit, str) else None

    return cached


def _weight_files(find: Callable[[str], Path | None]) -> list[Path] | None:
    index = find(WEIGHTS_INDEX)
    names = [WEIGHTS]
    if index is not None:
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as e:
            raise RaylmError(f"model weights index '{index}' cannot be read: {first_line(e)}") from e
    files = [find(name) for name in names]
    return None if any(f is None for f in files) else files
