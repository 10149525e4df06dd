"""Plain torch, no Ray: loading models, and scoring requests (shared-prefix packing, token-budget batches, KL)."""
