"""`raylm ppl` and `raylm kl`: a corpus streamed through Ray Data to model actors, per-document sums folded on the
driver. Ray Data's knobs for every command that streams (these two, `raylm contamination`, `raylm membership`)
live here, in one place."""

# Rows per Ray Data batch (--docs-per-batch), per command. A batch is one call of an actor, so it should carry
# enough work to amortise Ray Data's per-batch cost, yet leave enough batches to keep every actor busy.
SCORING_DOCS_PER_BATCH = 32  # ppl/kl: corpus documents whose windows are scored together, to fill a token budget
SCAN_ROWS_PER_BATCH = 128  # contamination: n-gram lookup costs little per row, so more rows per call
# membership: a run scores task documents (thousands at most, not a corpus), so smaller batches spread them over
# every actor of the pool
MEMBERSHIP_DOCS_PER_BATCH = 16

# Seconds between saves of the scored documents (--checkpoint-every): what a killed run loses at most, against
# one checkpoint write per save
CHECKPOINT_EVERY_S = 60.0

READ_CPUS = 1.0  # kept free of actors for Ray Data's read tasks, or the stream stalls with every CPU held
