"""A model's shape as a plan needs it, read from its config and its class built on the meta device instead of
from loaded weights: its parameters, the dtype its weights load in, the scorer it resolves to, and what a causal
LM's Scorer plans its forward passes with on each device type. Every dry run (`raylm eval`, `raylm ppl`,
`raylm kl`) counts the tokens its run computes from this, with the scorer's own planner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raylm.models.spec import ModelSpec
from raylm.scoring.attention import AttentionPlan

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ScoringShape:
    """What an actor's Scorer plans its forward passes with (raylm.scoring.scorer.Scorer)."""

    max_length: int
    token_budget: int
    batch_size: int | None
    plan: AttentionPlan
    max_predicted: int

    def tokens(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> tuple[int, int]:
        """(tokens in requests, tokens computed) one Scorer.score call over these requests counts."""
        from raylm.scoring.scorer import planned_tokens

        return planned_tokens(contexts, continuations, self.max_length, self.token_budget, self.batch_size, True,
                              self.plan, self.max_predicted)


@dataclass(frozen=True)
class ModelShape:
    """The model as far as a plan needs it; `shapes` (per device type) only for a causal LM."""

    parameters: int
    dtype: str
    bytes_per_parameter: int
    scorer: str
    shapes: dict[str, ScoringShape]
    kv_bytes_per_token: int | None

    @property
    def weights_bytes(self) -> int:
        return self.parameters * self.bytes_per_parameter


def model_shape(spec: ModelSpec, batch_size: int | None) -> ModelShape:
    """The model's shape from its config and checkpoint headers, as an actor would load it."""
    import torch

    from raylm.models.context import context_length
    from raylm.models.devices import meta_model
    from raylm.models.loading import (load_config, load_implementation, loaded_dtype, parameter_count,
                                      resolve_scorer)
    from raylm.scoring.attention import attention_plan
    from raylm.scoring.memory import kv_bytes_per_token
    from raylm.scoring.scorer import (GPU_START_TOKEN_BUDGET, cpu_token_budget, logits_budget_bytes,
                                      max_predicted_positions)

    config = load_config(spec)
    scorer = resolve_scorer(spec, config)
    dtype = loaded_dtype(spec, config)
    size = torch.finfo(dtype).bits // 8
    if scorer == "mlm":
        return ModelShape(parameter_count(spec), str(dtype).removeprefix("torch."), size, scorer, {}, None)
    implementation = load_implementation(config, spec.trust_remote_code)
    if implementation is not None:
        config._attn_implementation = implementation
    model = meta_model(config, "AutoModelForCausalLM", dtype, spec.trust_remote_code)
    head = model.get_output_embeddings()
    max_length = context_length(spec, config, "causal")
    budgets = {"cpu": cpu_token_budget(config), "cuda": GPU_START_TOKEN_BUDGET}
    shapes = {device: ScoringShape(max_length, budgets[device], batch_size, attention_plan(model),
                                   max_predicted_positions(model, head, logits_budget_bytes(device)))
              for device in DEVICES}
    return ModelShape(parameter_count(spec), str(dtype).removeprefix("torch."), size, scorer, shapes,
                      kv_bytes_per_token(config, dtype))
