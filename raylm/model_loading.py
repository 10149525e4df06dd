"""Loading a causal LM and its tokenizer through the same `from_pretrained` path for hub ids and local dirs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from raylm.errors import RaylmError

DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFE_WEIGHTS = "*.safetensors"
PICKLE_WEIGHTS = "pytorch_model*.bin"


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to load the same model on any node; small and picklable so it can travel to actors."""

    path: str
    dtype: str = "auto"
    device: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False  # pickle weights (pytorch_model.bin) can run code when loaded: opt-in only

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def looks_local(path: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else is meant as a directory on disk."""
    return path.startswith((".", "/", "~")) or path.count("/") > 1 or Path(path).exists()


def check_model_path(spec: ModelSpec) -> None:
    """Fail on the driver, before any actor starts, with a message naming the directory."""
    if not looks_local(spec.path):
        return
    path = Path(spec.path).expanduser()
    if not path.is_dir():
        raise RaylmError(f"model path '{spec.path}' does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise RaylmError(f"model directory '{spec.path}' has no config.json")
    if any(path.glob(SAFE_WEIGHTS)):
        return
    if not any(path.glob(PICKLE_WEIGHTS)):
        raise RaylmError(f"model directory '{spec.path}' has no weights (*.safetensors or pytorch_model*.bin)")
    if not spec.allow_pickle:
        raise RaylmError(f"model directory '{spec.path}' has only pickle weights (pytorch_model*.bin), which can run "
                         "code when loaded; pass --allow-pickle if you trust them, or convert them to safetensors")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise RaylmError(f"unknown --device '{device}' (use auto, cpu or cuda)")
    return device


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(_source(spec), revision=spec.revision,
                                             trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as e:
        raise RaylmError(f"could not load the tokenizer of '{spec.path}': {_first_line(e)}") from e


def load_model(spec: ModelSpec) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if spec.dtype not in DTYPES:
        raise RaylmError(f"unknown --dtype '{spec.dtype}' (use {', '.join(DTYPES)})")
    try:
        model = AutoModelForCausalLM.from_pretrained(_source(spec), revision=spec.revision, dtype=DTYPES[spec.dtype],
                                                     trust_remote_code=spec.trust_remote_code,
                                                     use_safetensors=None if spec.allow_pickle else True)
    except (OSError, ValueError) as e:
        raise RaylmError(f"could not load model '{spec.path}': {_first_line(e)}") from e
    return model.to(resolve_device(spec.device)).eval()


def _source(spec: ModelSpec) -> str:
    return str(Path(spec.path).expanduser()) if looks_local(spec.path) else spec.path


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
