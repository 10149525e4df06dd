"""raylm: lm-evaluation-harness-compatible loglikelihood evaluation, scored by model-resident Ray actors."""

__version__ = "0.1.0"
