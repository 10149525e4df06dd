"""`raylm contamination` and `raylm membership`: which task documents a training corpus holds (n-gram overlap,
streamed over Ray Data), and what the model itself says about them (Min-K% Prob, zlib ratio)."""

DEFAULT_NGRAM = 13  # lm-eval's n (Janitor's ngram_n, generate_13_grams.py)
DEFAULT_DOCS_PER_BATCH = 128  # corpus rows per scanning call: enough to amortise Ray Data's per-batch cost
