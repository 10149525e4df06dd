"""Scored requests -> per-shard sums -> merged sums -> metrics -> results.json, samples and the printed table; the
checkpoint that lets a rerun resume."""
