"""`raylm ppl` and `raylm kl`: a corpus streamed through Ray Data to model actors, per-document sums folded on the
driver."""
