"""What the driver tokenises a run's requests with: the model's tokenizer and context length (its config, not its
weights), as an Encoder, or a MaskedEncoder for a model scored as a masked LM, the model's sampling defaults for
generation tasks, and the prompt format (system instruction, chat template) the requests are rendered in."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import Any

from raylm.errors import RaylmError
from raylm.models.context import context_length
from raylm.models.loading import load_config, load_generation_config, load_tokenizer, resolve_scorer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.generation import ModelSampling
from raylm.requests.masked import MaskedEncoder
from raylm.tasks.prompt import PromptFormat

log = logging.getLogger(__name__)

# One tokenizer per model for the driver's lifetime: a sweep or soak evaluating the same model again and again
# would otherwise grow the driver by megabytes per run (each new fast tokenizer keeps native memory once used).
driver_tokenizer = functools.lru_cache(maxsize=4)(load_tokenizer)


def driver_encoder(spec: ModelSpec) -> Encoder | MaskedEncoder:
    """The tokenizer and context length the driver tokenises with (the model's config, not its weights): a
    MaskedEncoder when the model is scored as a masked LM."""
    tokenizer = driver_tokenizer(spec)
    config = load_config(spec)
    kind = resolve_scorer(spec, config)
    max_length = context_length(spec, config, kind, tokenizer)
    try:
        if kind == "mlm":
            _refuse_causal_knobs(spec)
            return MaskedEncoder(tokenizer, max_length)
        encoder = Encoder(tokenizer, max_length, spec.add_bos_token, spec.prefix_token_id)
    except ValueError as e:
        raise RaylmError(str(e)) from e
    log.info("empty contexts and rolling windows are conditioned on token %d (%r)", encoder.prefix_token,
             tokenizer.decode(encoder.prefix_token))
    return encoder


def _refuse_causal_knobs(spec: ModelSpec) -> None:
    """HFLM's tokenisation knobs and adapters are a causal LM's; a masked LM would silently ignore them."""
    for name, value in (("--add-bos-token", spec.add_bos_token), ("--prefix-token-id", spec.prefix_token_id),
                        ("--peft", spec.peft)):
        if value is not None:
            raise RaylmError(f"{name} applies to causal LMs (HFLM's); '{spec.path}' is scored as a masked LM")


def driver_sampling(spec: ModelSpec) -> ModelSampling:
    """The model's own sampling defaults (its generation_config), which a generation table fills unset settings
    from as HF generate does."""
    return ModelSampling.of(load_generation_config(spec), spec.path)


def scored_spec(spec: ModelSpec, encoder: Encoder | MaskedEncoder) -> ModelSpec:
    """spec with the scorer it is scored with, as checkpoints and results record it."""
    return replace(spec, scorer="mlm" if isinstance(encoder, MaskedEncoder) else "causal")


def prompt_format(tokenizer, *, system_instruction: str | None = None, apply_chat_template: bool = False,
                  chat_template_name: str | None = None, chat_template_args: dict[str, Any] | None = None,
                  multiturn: bool = False, enable_thinking: bool | None = None) -> PromptFormat:
    """The run's system instruction and chat template (raylm.models.chat: chosen and applied as HFLM does). The
    keywords are EvalConfig's."""
    chat = None
    if apply_chat_template:
        from raylm.models.chat import ChatTemplate

        chat = ChatTemplate(tokenizer, chat_template_name, chat_template_args)
    return PromptFormat(system_instruction, chat, multiturn and chat is not None, bool(enable_thinking))
