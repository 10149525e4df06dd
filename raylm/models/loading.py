"""Loading a causal or masked LM and its tokenizer through the same `from_pretrained` path for hub ids and local
dirs, and deciding from a model's config which of the two it is.

torch is imported where a model is loaded, not with this module: the driver needs only ModelSpec and the checks
before it imports transformers (raylm.cluster.runtime.import_transformers).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from raylm.errors import RaylmError, first_line
from raylm.models.checkpoint_size import stored_parameters
from raylm.models.devices import Budget, count_parameters, placement_kwargs
from raylm.models.load_warnings import held_transformers_warnings
from raylm.models.spec import (
    PLL_VARIANTS,
    SCORERS,
    ModelSpec,
    adapter_source,
    check_choice,
    check_device,
    check_quantization,
    model_source,
)

if TYPE_CHECKING:
    import torch

# bitsandbytes' packed CPU kernel for 4-bit weights needs out_features % 32 == 0 and in_features % blocksize == 0;
# other layers (stories260K's 172-wide MLP) must take its generic path or the first forward fails.
CPU_PACKED_4BIT_BLOCK_N = 32
# On CPUs with AVX512-BF16, importing bitsandbytes tries to fetch an optional 4-bit kernel from the Hugging Face hub
# through the `kernels` package and warns when it cannot; offline, `kernels` (0.19.1 on) first warns that it skips
# the kernel's publisher check. Its built-in CPU kernel is what runs either way, so these warnings (once per actor,
# on every 4-bit load) tell a raylm user nothing they can act on: logger -> the start of the message dropped.
HUB_KERNEL_WARNINGS = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "kernels._internals.hf_hub": "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'",
}
_TRANSFORMERS_IMPORT = threading.Lock()


def resolve_device(device: str) -> str:
    import torch

    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _from_transformers(name: str) -> Any:
    """transformers.<name>, imported under a lock: two threads importing transformers for the first time at once
    (a sweep tokenises each model on its own thread) can fail with "cannot import name 'AutoTokenizer' from
    'transformers'" (raylm.cluster.runtime.import_transformers says why)."""
    with _TRANSFORMERS_IMPORT:
        import transformers

        return getattr(transformers, name)


def load_tokenizer(spec: ModelSpec):
    """The tokenizer as HFLM loads it: with add_bos_token passed through when it is set (a Llama tokenizer loaded
    with add_bos_token=False adds no BOS even when asked for special tokens)."""
    extra = {} if spec.add_bos_token is None else {"add_bos_token": spec.add_bos_token}
    return _from_pretrained("AutoTokenizer", "the tokenizer", spec, **extra)


def load_config(spec: ModelSpec):
    """The model's config (its context length, its MLP width) without its weights, from the same source as
    load_tokenizer and load_model: `~` expanded, revision and remote-code setting honoured."""
    return _from_pretrained("AutoConfig", "the config", spec)


def load_generation_config(spec: ModelSpec):
    """The model's generation defaults as `from_pretrained` gives them to the model (model.generation_config): its
    generation_config.json, else what its config implies. HF generate starts from these where a call leaves a
    setting unset, so they decide a sampled generation as much as the call's own arguments."""
    try:
        return _from_transformers("GenerationConfig").from_pretrained(
            model_source(spec), revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except OSError:
        return _from_transformers("GenerationConfig").from_model_config(load_config(spec))


def _from_pretrained(auto_class: str, what: str, spec: ModelSpec, **extra: Any) -> Any:
    try:
        return _from_transformers(auto_class).from_pretrained(model_source(spec), revision=spec.revision,
                                                              trust_remote_code=spec.trust_remote_code, **extra)
    except (OSError, ValueError) as e:
        raise RaylmError(f"could not load {what} of '{spec.path}': {first_line(e)}") from e


def masked_or_causal(config) -> str:
    """"mlm" or "causal", from the config alone, in this order:

    1. `architectures`, what the checkpoint was saved as: a *ForMaskedLM class is mlm; *ForCausalLM or
       *LMHeadModel is causal. BERT, RoBERTa, ELECTRA, XLM-R and others have both kinds of class
       (RobertaForCausalLM is the encoder run as a decoder), so the model type cannot decide when this is stated.
    2. `is_decoder` / `is_encoder_decoder`: an encoder family configured as a decoder is causal, and
       encoder-decoder models (BART, in both auto mappings) are not scored as masked LMs.
    3. A model type with a masked-LM class in transformers' auto mapping is mlm (an unlabelled BERT or
       DeBERTa checkpoint); anything else is causal, as before masked LMs were supported.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    for name in getattr(config, "architectures", None) or ():
        if name.endswith("ForMaskedLM"):
            return "mlm"
        if name.endswith(("ForCausalLM", "LMHeadModel")):
            return "causal"
    if getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        return "causal"
    return "mlm" if getattr(config, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES else "causal"


def resolve_scorer(spec: ModelSpec, config) -> str:
    """The scorer a run uses: --scorer when given, else what the config says the model is. A PLL variant other
    than the default asked of a causal LM is refused: it would be silently ignored."""
    check_choice("scorer", spec.scorer, SCORERS)
    scorer = masked_or_causal(config) if spec.scorer == "auto" else spec.scorer
    if scorer == "causal" and spec.pll != PLL_VARIANTS[0]:
        raise RaylmError(f"--pll {spec.pll} applies to masked language models; '{spec.path}' is scored as a causal "
                         "LM (pass --scorer mlm if it is a masked LM)")
    return scorer


def text_config(config):
    """The language model's own config, for models whose top-level config wraps one (Gemma-3, LLaVA-style), found
    as lm-eval's HFLM finds it (its context length and vocabulary size read `config.text_config` first), so every
    reader of the config agrees with lm-eval on which one is meant."""
    return getattr(config, "text_config", None) or config


def load_implementation(config, trust_remote_code: bool) -> str | None:
    """The attention implementation raylm asks from_pretrained for: sdpa where the class supports it, else eager
    (Gemma-2, BLOOM, MPT). None leaves the choice where it already is: an implementation the model's config.json
    states (the user's or the author's), or remote code's own default. Either way the plan is made from the
    implementation the loaded model ends up with, since a config.json "attn_implementation" wins over the
    argument."""
    if text_config(config)._attn_implementation is not None or _is_remote(config, trust_remote_code):
        return None
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.auto_factory import _get_model_class

    if type(config) not in AutoModelForCausalLM._model_mapping:
        return None
    model_class = _get_model_class(config, AutoModelForCausalLM._model_mapping)
    return "sdpa" if model_class._supports_sdpa else "eager"


def _is_remote(config, trust_remote_code: bool) -> bool:
    return trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})


def model_class(kind: str) -> str:
    """The transformers auto class a model of this kind ("causal" or "mlm") loads as."""
    return "AutoModelForMaskedLM" if kind == "mlm" else "AutoModelForCausalLM"


def parameter_count(spec: ModelSpec) -> int:
    """The model's parameters, with no weight read: what sizes the work of a run (raylm.cluster.placement.Work).
    From the checkpoint's safetensors headers where its files are here (raylm.models.checkpoint_size), else from
    its config on the meta device, as the scorer the config resolves to (causal or masked) loads it."""
    stored = stored_parameters(spec)
    if stored is not None:
        return stored
    config = load_config(spec)
    return count_parameters(config, model_class(resolve_scorer(spec, config)), spec.trust_remote_code)


def load_model(spec: ModelSpec, kind: str = "causal", gpus: int = 1,
               budget: Budget | None = None) -> torch.nn.Module:
    """The model with its causal LM head, or (kind "mlm") its masked-LM head, which must be in the checkpoint.

    Weights load straight onto the device they run on (raylm.models.devices): spread over `gpus` CUDA devices
    when more than one, or over the devices of `budget` when given (GPUs, "cpu", "disk").
    """
    name = model_class(kind)
    auto_class = _from_transformers(name)

    spec.validate()
    device = resolve_device(spec.device)
    config = load_config(spec)
    dtype = _torch_dtype(spec.dtype)
    if spec.quantization:
        # bitsandbytes weights are placed by from_pretrained on one device.
        placement = {"quantization_config": quantization_config(spec.quantization), "device_map": {"": device}}
    else:
        placement = placement_kwargs(device, config, loaded_dtype(spec, config), gpus, budget, name,
                                     spec.trust_remote_code)
    # A causal LM's attention implementation is chosen here rather than left to transformers' default, because
    # whether requests may share a row depends on it (raylm.scoring.attention plans from what the model ends up
    # with). A masked LM's copies never share a row.
    implementation = load_implementation(config, spec.trust_remote_code) if kind == "causal" else None
    if implementation is not None:
        placement["attn_implementation"] = implementation
    try:
        with held_transformers_warnings():
            model, info = auto_class.from_pretrained(model_source(spec), revision=spec.revision, dtype=dtype,
                                                     trust_remote_code=spec.trust_remote_code,
                                                     use_safetensors=None if spec.allow_pickle else True,
                                                     output_loading_info=True, **placement)
    except (OSError, ValueError) as e:
        raise RaylmError(f"could not load model '{spec.path}': {first_line(e)}") from e
    if kind == "mlm":
        _refuse_missing_head(spec, model, info["missing_keys"])
    if spec.peft is not None:
        _load_adapter(spec, model)
    _use_fused_tanh_gelu(model)
    if spec.quantization:
        _avoid_unpackable_cpu_4bit(model)
    return model.eval()


def _load_adapter(spec: ModelSpec, model: torch.nn.Module) -> None:
    """HFLM's peft=: the adapter's layers injected into `model` in place (not merged, as HFLM runs it), so the
    model keeps its class and raylm plans and scores it as the base. As HFLM does first, a base whose vocabulary
    size differs from its tokenizer's length has its embeddings resized to the tokenizer (LoRAs that add tokens
    ship a base tokenizer that already has them). A prompt-learning adapter, which injects nothing and so would
    leave the base's numbers, was refused by load_model's spec.validate() (raylm.models.spec.check_peft)."""
    from peft import PeftModel

    vocab_size = getattr(text_config(model.config), "vocab_size", None)
    tokenizer_size = len(load_tokenizer(spec))
    if vocab_size is not None and vocab_size != tokenizer_size:
        logging.getLogger(__name__).info("resizing '%s' embeddings from %d to the tokenizer's %d before loading "
                                         "adapter '%s' (as HFLM does)", spec.path, vocab_size, tokenizer_size,
                                         spec.peft)
        model.resize_token_embeddings(tokenizer_size)
    try:
        PeftModel.from_pretrained(model, adapter_source(spec), revision=spec.peft_revision)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise RaylmError(f"could not load adapter '{spec.peft}' onto '{spec.path}': {first_line(e)}") from e


def _refuse_missing_head(spec: ModelSpec, model: torch.nn.Module, missing_keys: list[str]) -> None:
    """A masked-LM head that is not in the checkpoint would be randomly initialised, and its PLLs meaningless.

    The config cannot show this: a bare BertModel, an ELECTRA discriminator (ElectraForPreTraining), DeBERTa-v3
    (trained by replaced-token detection, no MLM head) and DeBERTa v1/v2 read with the default legacy=True (their
    head is saved as lm_predictions.*, which is then ignored) all load into AutoModelForMaskedLM with a fresh head.
    """
    encoder = model.base_model_prefix + "."
    missing = sorted(k for k in missing_keys if not k.startswith(encoder))
    if not missing:
        return
    hint = " (DeBERTa v1/v2 checkpoints need legacy=false in their config; DeBERTa-v3 has no MLM head)" \
        if model.config.model_type.startswith("deberta") else ""
    raise RaylmError(f"'{spec.path}' holds no trained masked-LM head: {', '.join(missing[:4])}"
                     f"{' ...' if len(missing) > 4 else ''} would be random{hint}")


def _use_fused_tanh_gelu(model: torch.nn.Module) -> None:
    """Swap transformers' `gelu_new` (tanh GELU spelled as five elementwise torch ops) for torch's fused kernel
    of the same formula, as transformers' own `gelu_pytorch_tanh` does.

    GPT-2-family models use gelu_new; on CPU its ops were 15% of scoring time, each pass over the MLP's
    activations memory-bound. Outputs move by float32 rounding only (tests/test_model_loading.py).
    """
    from transformers.activations import GELUTanh, NewGELUActivation

    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is NewGELUActivation:
                setattr(parent, name, GELUTanh())


def quantization_config(quantization: str):
    """bitsandbytes settings for a ModelSpec.quantization value; bitsandbytes is imported only when asked for."""
    import torch

    check_quantization(quantization)
    for logger, message in HUB_KERNEL_WARNINGS.items():
        logging.getLogger(logger).addFilter(_HubKernelWarning(message))
    import bitsandbytes  # noqa: F401  (imported now so the filter above is in place before it logs)
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


class _HubKernelWarning(logging.Filter):
    """Drops one logger's hub-kernel warning (HUB_KERNEL_WARNINGS); equal filters count once, so adding one per
    load keeps a single filter on each logger."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _HubKernelWarning) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.message)


def _avoid_unpackable_cpu_4bit(model: torch.nn.Module) -> None:
    import bitsandbytes as bnb

    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        blocksize = module.weight.quant_state.blocksize
        if module.out_features % CPU_PACKED_4BIT_BLOCK_N or module.in_features % blocksize:
            module.support_avx512bf16_for_cpu = False


def loaded_dtype(spec: ModelSpec, config) -> torch.dtype:
    """The dtype the model's weights have once loaded (--dtype, or for "auto" the checkpoint's own): what a device
    map is sized in, and a dry run's plan."""
    return _planning_dtype(_torch_dtype(spec.dtype), config)


def _torch_dtype(name: str):
    import torch

    return name if name == "auto" else getattr(torch, name)


def _planning_dtype(dtype, config):
    """The dtype weights will have once loaded, which a device map is sized in: "auto" is the checkpoint's own."""
    import torch

    if dtype != "auto":
        return dtype
    stated = getattr(text_config(config), "dtype", None) or getattr(config, "dtype", None)
    if isinstance(stated, str):
        stated = getattr(torch, stated, None)
    return stated if isinstance(stated, torch.dtype) else torch.float32
