"""Plain torch, no Ray: loading models, and scoring requests (shared-prefix packing, token-budget batches, KL); a
scored shard's predictions and sums, which the actor that scored it computes."""
