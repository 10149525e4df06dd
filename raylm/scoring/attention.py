"""Per model: which attention implementation to load it with, whether its requests may share a packed row, and
which masks a packed row must carry. Plain functions of the config, the class and the loaded model.

A packed row is exact only if every layer of the model sees, from each branch column, the keys the request alone
would see at the same relative positions. transformers 5.24 gives different answers per family, each proven
against scoring alone and the float64 reference in tests/test_architectures.py:

* A caller's 4D mask is used unchanged by every layer: transformers applies no sliding window of its own to it.
  Mistral and Phi-3 slide in every layer when `config.sliding_window` is set, so one 4D tensor with the window
  folded in is exact for them.
* Qwen2, Gemma-2, Gemma-3 and Cohere2 take `attention_mask` as a dict keyed by layer type ("full_attention",
  "sliding_attention") and index it with `config.layer_types[i]`; one tensor there is wrong for some layers.
* ALiBi families (BLOOM, MPT, Falcon with alibi=True) build their bias from column indices or a 2D mask's
  cumsum, not from position ids, so a later branch's keys get the wrong distances (or the model raises): they
  are scored unpacked.
* Only sdpa and eager add a caller's 4D float mask to the scores. flash_attention_* reads a 4D mask as a padding
  mask, and flex_attention crashed the process given one (torch 2.13, CPU): any other implementation is scored
  unpacked, and never handed such a mask.

The window rule is the same for every windowed family: key k is visible from query q iff q - k < sliding_window,
with distances taken between branch positions (the positions tokens have when the request is scored alone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from raylm.models.loading import text_config

FULL, SLIDING = "full_attention", "sliding_attention"
ONE_TENSOR = ""  # mask key meaning "one 4D tensor, used by every layer"
MASKABLE_IMPLEMENTATIONS = ("sdpa", "eager")
ALIBI_MODEL_TYPES = ("bloom", "mpt")  # plus falcon when config.alibi is set
MASK_DICT_MODEL_TYPES = ("qwen2", "gemma2", "gemma3_text", "cohere2")
# Classes whose packed scoring tests/test_architectures.py proves equal to scoring alone (under sdpa and eager, with
# the layout mask_layout gives them). Falcon with alibi=True shares its class and is unpacked by the ALiBi rule.
PROVEN_CLASSES = frozenset({
    "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM", "GPTNeoXForCausalLM", "OPTForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM",
    "FalconForCausalLM", "GPTJForCausalLM", "OlmoForCausalLM", "Olmo2ForCausalLM", "Cohere2ForCausalLM",
})

MaskLayout = tuple[tuple[str, "int | None"], ...]  # (mask key, sliding window or None) per mask a packed row needs


@dataclass(frozen=True)
class AttentionPlan:
    """How the scorer feeds one loaded model.

    `masks` is the layout of a packed row's masks: a single ONE_TENSOR key for one 4D tensor, else a dict keyed by
    layer type. `needs_check` marks a model no test has proven (remote code, a new architecture): it packs only
    once a start-up check on real requests agrees (raylm.scoring.startup_check). `prefix_sharing` is the verdict
    results.json records as config.prefix_sharing.
    """

    implementation: str
    pack: bool
    masks: MaskLayout
    prefix_sharing: str
    needs_check: bool = False

    def unpacked(self, verdict: str) -> AttentionPlan:
        return replace(self, pack=False, needs_check=False, prefix_sharing=verdict)

    def packed(self, verdict: str) -> AttentionPlan:
        return replace(self, pack=True, needs_check=False, prefix_sharing=verdict)


def attention_plan(model) -> AttentionPlan:
    """The static rule for a loaded model: packed for proven families, unpacked where packing cannot be exact,
    and for anything else unpacked until a start-up check agrees."""
    config = text_config(model.config)
    implementation = config._attn_implementation or "eager"
    name = type(model).__name__
    proven = name in PROVEN_CLASSES and type(model).__module__.startswith("transformers.")
    masks = mask_layout(config, proven)
    plan = AttentionPlan(implementation, False, masks or ((ONE_TENSOR, None),), "")
    if implementation not in MASKABLE_IMPLEMENTATIONS:
        return plan.unpacked(f"unpacked (attention implementation {implementation!r} takes no 4D mask)")
    if not getattr(config, "is_causal", True) or getattr(config, "use_bidirectional_attention", False):
        return plan.unpacked("unpacked (bidirectional attention)")
    if config.model_type in ALIBI_MODEL_TYPES or (config.model_type == "falcon" and getattr(config, "alibi", False)):
        return plan.unpacked(f"unpacked (ALiBi: {name})")
    if masks is None:
        return plan.unpacked(f"unpacked (layer types {sorted(set(config.layer_types))} have no known mask)")
    if proven:
        return plan.packed(f"packed (proven family: {name}, {implementation})")
    return replace(plan, needs_check=True, prefix_sharing=f"unpacked ({name} not proven; start-up check not run)")


def mask_layout(config, proven: bool) -> MaskLayout | None:
    """Mask key -> window: per layer type for the families whose forward takes a dict (and, as a guess the start-up
    check must confirm, for unproven models that state layer_types), else one tensor, windowed when
    config.sliding_window is set. None: a layer type no mask here describes (chunked, linear attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types and (config.model_type in MASK_DICT_MODEL_TYPES or not proven):
        if not set(layer_types) <= {FULL, SLIDING}:
            return None
        return tuple((kind, window if kind == SLIDING else None) for kind in sorted(set(layer_types)))
    return ((ONE_TENSOR, window),)
