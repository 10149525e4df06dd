"""What names a model and how it is to be loaded, checked on the driver before any actor loads weights.

Nothing here imports torch or transformers: the CLI, sweep files and the driver's pre-flight checks need ModelSpec
long before a model loads, and `raylm eval` starts Ray while a thread imports torch and transformers to tokenise.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError

DTYPES = ("auto", "float32", "bfloat16", "float16")
SAFE_WEIGHTS = "*.safetensors"
PICKLE_WEIGHTS = "pytorch_model*.bin"
QUANTIZATIONS = ("4bit", "8bit")
SCORERS = ("auto", "causal", "mlm")
# Pseudo-log-likelihood variants (raylm.scoring.mlm): Salazar et al.'s, and Kauf & Ivanova's within-word l2r.
PLL_VARIANTS = ("original", "word-l2r")
# transformers loads bitsandbytes models through accelerate's device_map; neither is imported unless asked for.
QUANTIZATION_PACKAGES = ("bitsandbytes", "accelerate")


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to load the same model on any node; small and picklable so it can travel to actors."""

    path: str
    dtype: str = "auto"
    device: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False  # pickle weights (pytorch_model.bin) can run code when loaded: opt-in only
    quantization: str | None = None  # None, "4bit" (nf4, double quant, bf16 compute) or "8bit" (LLM.int8)
    scorer: str = "auto"  # "auto" (from the config: masked_or_causal), "causal" or "mlm"
    pll: str = "original"  # the PLL variant a masked LM is scored with
    # HFLM's max_length: the context requests are left-truncated to and rolling windows are cut to (None: the
    # model's own, raylm.models.context). It travels with the spec so the driver, every actor and the checkpoint's
    # fingerprint agree on it.
    max_length: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        """Refuse unknown settings where a run starts (the driver, a sweep file), before any actor loads weights."""
        check_dtype(self.dtype)
        check_device(self.device)
        check_quantization(self.quantization)
        check_choice("scorer", self.scorer, SCORERS)
        check_choice("PLL variant", self.pll, PLL_VARIANTS)
        if self.max_length is not None and self.max_length < 1:
            raise RaylmError(f"--max-length must be a positive number of tokens, got {self.max_length}")


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise RaylmError(f"unknown {what} {value!r} (use {', '.join(allowed)})")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise RaylmError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")


def check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise RaylmError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)")


def check_quantization(quantization: str | None) -> None:
    """Refuse an unknown quantization, or one whose packages are missing: on the driver before Ray starts, and
    again where a model loads."""
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise RaylmError(f"unknown quantization '{quantization}' (use {' or '.join(QUANTIZATIONS)})")
    missing = [name for name in QUANTIZATION_PACKAGES if not _importable(name)]
    if missing:
        raise RaylmError(f"{quantization} loading needs {' and '.join(QUANTIZATION_PACKAGES)}, which `pip install "
                         f"raylm` brings; {', '.join(missing)} is not installed here (pip install "
                         f"{' '.join(QUANTIZATION_PACKAGES)})")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def looks_local(path: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else is meant as a directory on disk."""
    return path.startswith((".", "/", "~")) or path.count("/") > 1 or Path(path).exists()


def model_source(spec: ModelSpec) -> str:
    """What from_pretrained is given: a local directory with `~` expanded, or the hub id."""
    return str(Path(spec.path).expanduser()) if looks_local(spec.path) else spec.path


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
