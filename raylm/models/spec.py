"""What names a model and how it is to be loaded, checked on the driver before any actor loads weights.

Nothing here imports torch or transformers: the CLI, sweep files and the driver's pre-flight checks need ModelSpec
long before a model loads, and `raylm eval` starts Ray while a thread imports torch and transformers to tokenise.
The one exception is a spec with an adapter, whose config is read through peft (which imports both) when the spec
is validated, before any thread starts.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError, first_line

DTYPES = ("auto", "float32", "bfloat16", "float16")
SAFE_WEIGHTS = "*.safetensors"
PICKLE_WEIGHTS = "pytorch_model*.bin"
QUANTIZATIONS = ("4bit", "8bit")
SCORERS = ("auto", "causal", "mlm")
# Pseudo-log-likelihood variants (raylm.scoring.mlm): Salazar et al.'s, and Kauf & Ivanova's within-word l2r.
PLL_VARIANTS = ("original", "word-l2r")
# transformers loads bitsandbytes models through accelerate's device_map; neither is imported unless asked for.
QUANTIZATION_PACKAGES = ("bitsandbytes", "accelerate")
PEFT_PACKAGE = "peft"  # the raylm[peft] extra: LoRA and other adapters loaded onto the base model (HFLM's peft=)


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
    # HFLM's peft=: an adapter (local directory or hub id) loaded onto the base weights in every actor;
    # peft_revision is the adapter's own pinned hub commit (raylm.models.identity.pin_revision), None when local.
    peft: str | None = None
    peft_revision: str | None = None
    # HFLM's tokenisation knobs. add_bos_token: None keeps the tokenizer's own special-token default, True/False
    # loads the tokenizer with that add_bos_token and encodes with add_special_tokens set to it. prefix_token_id:
    # the token empty contexts and rolling windows are conditioned on (default BOS, else EOS).
    add_bos_token: bool | None = None
    prefix_token_id: int | None = None

    def __post_init__(self) -> None:
        # Whether a path names a directory on disk is decided here, once, where the spec is made (the driver): a
        # local one becomes absolute, so actors in another working directory, or on another node, never guess
        # again, and a hub id that exists nowhere here stays a hub id everywhere.
        for name in ("path", "peft"):
            value = getattr(self, name)
            if value is not None and (looks_local(value) or Path(value).exists()):
                object.__setattr__(self, name, os.path.abspath(os.path.expanduser(value)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lmeval_model_args(self) -> dict[str, Any]:
        """This model as lm-eval's `--model hf --model_args` would name it (what its CLI also hands the tasks as
        metadata): pretrained, then every HFLM argument this spec sets away from HFLM's default."""
        args: dict[str, Any] = {"pretrained": self.path}
        for key, value, default in (("dtype", self.dtype, "auto"), ("revision", self.revision, None),
                                    ("trust_remote_code", self.trust_remote_code, False),
                                    ("max_length", self.max_length, None), ("peft", self.peft, None),
                                    ("add_bos_token", self.add_bos_token, None),
                                    ("prefix_token_id", self.prefix_token_id, None),
                                    ("load_in_4bit", self.quantization == "4bit", False),
                                    ("load_in_8bit", self.quantization == "8bit", False)):
            if value != default:
                args[key] = value
        return args

    def validate(self) -> None:
        """Refuse unknown settings where a run starts (the driver, a sweep file), before any actor loads weights."""
        check_dtype(self.dtype)
        check_device(self.device)
        check_quantization(self.quantization)
        check_choice("scorer", self.scorer, SCORERS)
        check_choice("PLL variant", self.pll, PLL_VARIANTS)
        if self.max_length is not None and self.max_length < 1:
            raise RaylmError(f"--max-length must be a positive number of tokens, got {self.max_length}")
        if self.prefix_token_id is not None and self.prefix_token_id < 0:
            raise RaylmError(f"--prefix-token-id must be a token id (0 or more), got {self.prefix_token_id}")
        if self.peft is not None:
            check_peft(self)


def check_peft(spec: ModelSpec) -> None:
    """An adapter needs the peft package (raylm[peft]), a causal LM to sit on, when local its directory, and a type
    that changes the model's own layers.

    raylm scores the base model with the adapter injected into it (LoRA, IA3, ...). A prompt-learning adapter
    (prompt tuning, prefix tuning, p-tuning, multitask prompt tuning, ...) injects nothing: it acts only through
    PeftModel's forward, which prepends its virtual tokens, so the base model's numbers would be reported under the
    adapter's name. Its config is read here (peft's own `is_prompt_learning`), where the driver checks a run
    before any actor starts and where each actor loads its model."""
    if not _importable(PEFT_PACKAGE):
        raise RaylmError(f"--peft {spec.peft} needs the peft package: pip install -e \".[peft]\" in the raylm checkout")
    if spec.scorer == "mlm":
        raise RaylmError("--peft applies to causal LMs (HFLM's peft=); this run scores a masked LM")
    if looks_local(spec.peft):
        path = Path(spec.peft).expanduser()
        if not (path / "adapter_config.json").is_file():
            raise RaylmError(f"adapter path '{spec.peft}' has no adapter_config.json (save it with "
                             "PeftModel.save_pretrained)")
    from peft import PeftConfig

    try:
        config = PeftConfig.from_pretrained(adapter_source(spec), revision=spec.peft_revision)
    except (OSError, ValueError, TypeError) as e:
        raise RaylmError(f"could not read the config of adapter '{spec.peft}': {first_line(e)}") from e
    if config.is_prompt_learning:
        kind = getattr(config.peft_type, "value", config.peft_type)
        raise RaylmError(f"adapter '{spec.peft}' is {kind}, a prompt-learning adapter, which raylm cannot score "
                         "(its virtual tokens act only through PeftModel's forward); use a LoRA, IA3 or other "
                         "adapter that changes the model's layers")


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise RaylmError(f"unknown {what} {value!r} (use {', '.join(allowed)})")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise RaylmError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")


def check_device(device: str) -> None:
    if device == "mps" or device.startswith("mps:"):
        raise RaylmError(f"--device {device} (Apple's Metal) is not supported: raylm places its scoring actors "
                         "on the GPUs Ray counts, and Ray counts no Apple GPU; on a Mac use --device cpu")
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
    """Hub ids are 'name' or 'org/name'; anything else is meant as a directory on disk. A spec's paths were made
    absolute where it was made if they exist there (ModelSpec), so this never asks the filesystem."""
    return path.startswith((".", "/", "~")) or path.count("/") > 1


def model_source(spec: ModelSpec) -> str:
    """What from_pretrained is given: a local directory with `~` expanded, or the hub id."""
    return str(Path(spec.path).expanduser()) if looks_local(spec.path) else spec.path


def adapter_source(spec: ModelSpec) -> str:
    """What peft is given for --peft: a local directory with `~` expanded, or the hub id."""
    return str(Path(spec.peft).expanduser()) if looks_local(spec.peft) else spec.peft


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
