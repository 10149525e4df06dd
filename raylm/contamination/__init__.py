"""`raylm contamination` and `raylm membership`: which task documents a training corpus holds (n-gram overlap,
streamed over Ray Data), and what the model itself says about them (Min-K% Prob, zlib ratio; its maths is raylm.scoring.membership, its actor raylm.corpus.doc_scoring)."""

DEFAULT_NGRAM = 13  # lm-eval's n (Janitor's ngram_n, generate_13_grams.py)
