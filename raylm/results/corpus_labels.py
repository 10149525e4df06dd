"""The names a corpus run's outputs go by: its label (results.json's one key, samples/<label>.parquet), its command
(results.json's config.command), the column of its samples that holds each document's loss, and the one that holds
its domain. raylm.corpus writes its outputs under these names and raylm.compare reads them by the same ones, so they live
below both."""

from __future__ import annotations

PATH_DOMAIN = "path"  # --domain-column path: each file its own domain
PPL, PSEUDO_PPL, KL = "ppl", "pseudo_ppl", "kl"  # a masked LM's `raylm ppl` is labelled pseudo_ppl
LABELS = (PPL, PSEUDO_PPL, KL)
COMMANDS = (PPL, KL)
# A label -> its samples' per-document loss column and the sign that makes it an NLL in nats (a masked LM's PLL is
# a loglikelihood); `kl` rows hold no one model's NLL.
NLL_COLUMNS = {PPL: ("nll", 1.0), PSEUDO_PPL: ("pll", -1.0)}


def domain_samples_column(domain_column: str | None) -> str | None:
    """The samples' column that holds each document's domain under --domain-column: `path` (each file its own
    domain) for `path`, else `domain` (raylm.corpus.read.read_corpus renames the corpus's column so); None without
    domains."""
    if domain_column is None:
        return None
    return "path" if domain_column == PATH_DOMAIN else "domain"
