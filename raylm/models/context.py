"""How many tokens a model takes: the one place that decides it for the driver, the actors, `raylm ppl`/`kl` and
`RayLM`, so that requests are cut to the same length everywhere.

A causal LM follows lm-eval 0.4.13 (HFLM.max_length): the length the model config states (text_config first),
else the tokenizer's model_max_length, else 2048. A masked LM takes the smaller of its tokenizer's limit and its
position table, less RoBERTa's padding offset. ModelSpec.max_length (HFLM's `max_length=`) replaces either; it
may shorten the context but not extend it past what the model states, which a model with absolute positions (GPT-2)
cannot score and a rotary one was not trained for.
"""

from __future__ import annotations

from raylm.errors import RaylmError
from raylm.models.loading import text_config
from raylm.models.spec import ModelSpec

# transformers sets model_max_length to int(1e30) when a tokenizer states no limit; anything this large is none.
NO_LIMIT = 10**30
DEFAULT_MAX_LENGTH = 2048  # lm-eval's HFLM._DEFAULT_MAX_LENGTH
_SEQLEN_CONFIG_ATTRS = ("n_positions", "max_position_embeddings", "n_ctx")
# Model types whose position ids start after the padding index (RoBERTa's create_position_ids_from_input_ids):
# roberta-base states max_position_embeddings 514 but takes 512 tokens; a 513-token input indexes past the table.
_POSITIONS_AFTER_PADDING = frozenset({
    "camembert", "data2vec-text", "esm", "ibert", "longformer", "luke", "mpnet", "roberta", "roberta-prelayernorm",
    "xlm-roberta", "xlm-roberta-xl", "xmod"})


def config_max_length(config) -> int | None:
    """The context length the model config states (text_config first), if any: lm-eval's first sources, which
    need no tokenizer, so an actor that has one never pays for loading it."""
    cfg = text_config(config)
    for attr in _SEQLEN_CONFIG_ATTRS:
        value = getattr(cfg, attr, None)
        if value is not None:
            return int(value)
    return None


def tokenizer_limit(tokenizer) -> int | None:
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit is not None and limit < NO_LIMIT else None


def resolve_max_length(config, tokenizer) -> int:
    """A causal LM's context length in lm-eval's order: text_config, model config, tokenizer, then 2048."""
    stated = config_max_length(config)
    if stated is not None:
        return stated
    limit = tokenizer_limit(tokenizer)
    return limit if limit is not None else DEFAULT_MAX_LENGTH


def masked_max_length(config, tokenizer) -> int:
    """The longest input a masked LM takes: the tokenizer's limit and the config's positions, whichever is smaller,
    with RoBERTa-style position offsets taken off the config's."""
    limits = []
    stated = config_max_length(config)
    if stated is not None:
        offset = (getattr(config, "pad_token_id", None) or 0) + 1 \
            if getattr(config, "model_type", None) in _POSITIONS_AFTER_PADDING else 0
        limits.append(stated - offset)
    limit = tokenizer_limit(tokenizer)
    if limit is not None:
        limits.append(limit)
    if not limits:
        raise RaylmError(f"neither the config nor the tokenizer of {getattr(tokenizer, 'name_or_path', '')!r} states "
                         "a maximum input length")
    return min(limits)


def context_length(spec: ModelSpec, config, kind: str, tokenizer=None) -> int:
    """The context a run scores `spec` with (kind "causal" or "mlm"): the model's own, or spec.max_length.

    `tokenizer` is loaded only when the config alone cannot say (an actor then never pays for loading one)."""
    if kind == "mlm" or config_max_length(config) is None:
        if tokenizer is None:
            from raylm.models.loading import load_tokenizer

            tokenizer = load_tokenizer(spec)
    own = masked_max_length(config, tokenizer) if kind == "mlm" else resolve_max_length(config, tokenizer)
    if spec.max_length is None:
        return own
    if spec.max_length > own:
        raise RaylmError(f"--max-length {spec.max_length} exceeds the {own}-token context of '{spec.path}'")
    return spec.max_length
