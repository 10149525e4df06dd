"""lm-eval's generate_until requests -> an Arrow generation table, one row per request and repeat, every row
holding exactly what raylm's generation engine (raylm.scoring.generation) needs and what HFLM would have used.

What HFLM.generate_until does before calling HF `generate` is done here, through lm-eval's own functions where it
has them: the request's gen_kwargs normalised (normalize_gen_kwargs, with HFLM's default of 256 new tokens), the
decoded EOS appended to the stop strings (handle_stop_sequences), the prompt encoded as tok_batch_encode encodes it
(raylm.requests.encoding.Encoder.encode_prompts) and left-truncated to max_length - max_gen_toks; then
_model_generate's sampling settings, with the model's generation_config and HF's global defaults where the request
leaves one unset (HF generate fills them in that order). A seed per (task, doc_id, idx, repeat), derived from the
run's torch seed, makes a sampled generation independent of shards, batches and actors. Generation arguments the
engine does not implement are refused by task and key rather than silently ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raylm.errors import RaylmError
from raylm.requests.encoding import Encoder

if TYPE_CHECKING:  # lm-eval's requests; the module itself imports lm-eval only to build them
    from raylm.tasks.lmeval.build import Request

SCHEMA = pa.schema([
    ("doc_id", pa.int64()),
    ("req_idx", pa.int32()),
    ("repeat", pa.int32()),
    ("context", pa.list_(pa.int32())),
    ("until", pa.list_(pa.string())),
    ("max_gen_toks", pa.int32()),
    ("do_sample", pa.bool_()),
    ("temperature", pa.float64()),
    ("top_k", pa.int32()),
    ("top_p", pa.float64()),
    ("seed", pa.int64()),
])
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's max_gen_toks
# The generation arguments raylm's engine implements (lm-eval's aliases of max_gen_toks included).
ENGINE_KWARGS = ("until", "max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens", "do_sample",
                 "temperature", "top_k", "top_p")
# HF's global defaults (GenerationConfig._get_default_generation_params) for the sampling settings raylm implements,
# and for the logits processors it does not: a model whose generation_config.json sets one of those differently
# would generate differently under HF generate.
HF_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
UNIMPLEMENTED_DEFAULTS = {"num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "typical_p": 1.0,
                          "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "min_length": 0,
                          "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None,
                          "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                          "encoder_repetition_penalty": 1.0, "penalty_alpha": None, "guidance_scale": None}


@dataclass(frozen=True)
class ModelSampling:
    """The model's generation_config values for the sampling settings a request may leave unset (HF's global
    defaults where the model sets none)."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0

    @classmethod
    def of(cls, generation_config: Any, model: str) -> ModelSampling:
        """From a transformers GenerationConfig; one that sets a logits processor raylm's engine lacks is refused,
        since HF generate, and so HFLM, would apply it to every generation."""
        for key, default in UNIMPLEMENTED_DEFAULTS.items():
            value = getattr(generation_config, key, None)
            if value is not None and value != default:
                raise RaylmError(f"model '{model}': its generation_config sets {key}={value!r}, which raylm's "
                                 "generation engine does not implement (HF generate would apply it)")
        values = {key: getattr(generation_config, key, None) for key in HF_SAMPLING_DEFAULTS}
        return cls(**{key: default if values[key] is None else values[key]
                      for key, default in HF_SAMPLING_DEFAULTS.items()})


@dataclass(frozen=True)
class Resolved:
    """One request's generation settings as HF generate would run them."""

    until: tuple[str, ...]
    max_gen_toks: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float


def is_generation(table: pa.Table) -> bool:
    """Whether a request table asks for generations (else it asks for likelihoods)."""
    return "until" in table.column_names


def check_gen_kwargs(gen_kwargs: Mapping[str, Any], where: str) -> None:
    """A one-line refusal of the first generation argument raylm's engine does not implement."""
    for key, value in gen_kwargs.items():
        if key not in ENGINE_KWARGS:
            raise RaylmError(f"{where}: generation argument {key}={value!r} is not implemented by raylm's "
                             f"generation engine (it takes {', '.join(ENGINE_KWARGS)})")


def resolve(gen_kwargs: Mapping[str, Any], eos: str | None, model: ModelSampling, where: str) -> Resolved:
    """HFLM.generate_until's normalize_gen_kwargs and handle_stop_sequences, then _model_generate's temperature and
    do_sample rule (a request always passes both, so the model's temperature is never used), then HF's order for
    top_k and top_p: the request's, else the model's generation_config's, else HF's global default."""
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

    check_gen_kwargs(gen_kwargs, where)
    try:
        kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), DEFAULT_MAX_GEN_TOKS))
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
    except (TypeError, ValueError) as e:
        raise RaylmError(f"{where}: generation arguments {dict(gen_kwargs)!r}: {e}") from e
    if not all(isinstance(term, str) for term in until):
        raise RaylmError(f"{where}: generation argument until={until!r} must be strings")
    do_sample = bool(kwargs["do_sample"])
    temperature = float(kwargs.get("temperature", 0.0))
    if not do_sample:
        return Resolved(tuple(until), kwargs["max_gen_toks"], False, 1.0, 0, 1.0)
    if not temperature > 0:
        raise RaylmError(f"{where}: do_sample=True with temperature={temperature}: HF generate refuses a temperature "
                         "that is not above 0 (for greedy decoding set do_sample=False)")
    top_k = kwargs.get("top_k", model.top_k)
    top_p = kwargs.get("top_p", model.top_p)
    return Resolved(tuple(until), kwargs["max_gen_toks"], True, temperature, int(top_k or 0),
                    float(1.0 if top_p is None else top_p))


def request_seed(seed: int | None, task: str, doc_id: int, idx: int, repeat: int) -> int:
    """The sampling seed of one generation: a digest of the run's seed and the generation's place in its task, so
    that it does not depend on which shard, batch or actor runs it (an unseeded run samples from seed 0)."""
    key = json.dumps([seed or 0, task, doc_id, idx, repeat]).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)


def eos_text(tokenizer) -> str | None:
    """HFLM's `eos`, the stop string every request gets: its EOS token decoded with special tokens kept."""
    eos = tokenizer.eos_token_id
    return None if eos is None else tokenizer.decode(eos, skip_special_tokens=False)


def generation_table(requests: Sequence[Request], encoder: Encoder, model: ModelSampling, seed: int | None,
                     metadata: dict[bytes, bytes] | None = None,
                     keys: Sequence[tuple[int, int]] | None = None) -> tuple[pa.Table, int]:
    """The requests as rows, `repeats` rows each (repeat 0, 1, ...), and how many prompts were left-truncated.
    `keys` replace the rows' (doc_id, req_idx) where the caller numbers requests its own way (RayLM); seeds are
    always drawn from the request's own task, doc_id and idx."""
    eos = eos_text(encoder.tokenizer)
    contexts = encoder.encode_prompts([r.arguments[0] for r in requests])
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    resolved: dict[str, Resolved] = {}
    truncated = 0
    for i, (request, context) in enumerate(zip(requests, contexts)):
        where = f"{request.task} (document {request.doc_id})"
        gen_kwargs = request.arguments[1]
        key = json.dumps(gen_kwargs, sort_keys=True, default=repr)
        if key not in resolved:
            resolved[key] = resolve(gen_kwargs, eos, model, where)
        settings = resolved[key]
        room = encoder.max_length - settings.max_gen_toks
        if room <= 0:
            raise RaylmError(f"{where}: max_gen_toks {settings.max_gen_toks} leaves no room for a prompt in the "
                             f"model's max length {encoder.max_length} (HFLM asserts the same)")
        if len(context) > room:
            truncated += 1
            context = context[-room:]
        if not context:
            raise RaylmError(f"{where}: the prompt encodes to no tokens, so there is nothing to generate from "
                             "(HF generate cannot start from an empty prompt either)")
        doc_id, req_idx = keys[i] if keys is not None else (request.doc_id, request.idx)
        for repeat in range(request.repeats):
            for name, value in (("doc_id", doc_id), ("req_idx", req_idx), ("repeat", repeat), ("context", context),
                                ("until", list(settings.until)), ("max_gen_toks", settings.max_gen_toks),
                                ("do_sample", settings.do_sample), ("temperature", settings.temperature),
                                ("top_k", settings.top_k), ("top_p", settings.top_p),
                                ("seed", request_seed(seed, request.task, request.doc_id, request.idx, repeat))):
                cols[name].append(value)
    return pa.table(cols, schema=SCHEMA.with_metadata(metadata)), truncated
