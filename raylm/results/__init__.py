"""Per-shard sums -> merged sums -> metrics -> results.json, samples and the printed table."""
