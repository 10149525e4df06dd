"""Offline lm-eval generate_until tasks for the tests: lm-eval's own gsm8k YAMLs with their data pointed at the
shared GSM8K (saved with `save_to_disk`), as a user passes them with --include-path.

- gsm8k_local, gsm8k_cot_local (and the mmlu_generative_local group): tests/golden/make_generation_tasks.py's, the
  YAMLs lm-eval's generation goldens were made with;
- gsm8k_vote_local: gsm8k_cot_self_consistency (sampled, majority vote) at 8 repeats instead of 64 (its maj@8
  filter needs 8);
- gsm8k_ll_local: a loglikelihood task on the same documents, and gen_mixed_local, a group of it and gsm8k_local.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))

from make_generation_tasks import GSM8K, data_yaml, gsm8k_yaml, write_tasks  # noqa: E402

NAMES = ("gsm8k_local", "gsm8k_cot_local", "gsm8k_vote_local", "gsm8k_ll_local", "gen_mixed_local")


def write_generation_tasks(out: Path) -> Path:
    """The YAMLs above in `out` (an --include-path)."""
    write_tasks(out)
    (out / "gsm8k_vote_local.yaml").write_text(
        gsm8k_yaml("gsm8k_vote_local", "gsm8k/gsm8k-cot-self-consistency.yaml") + "tag: null\nrepeats: 8\n")
    (out / "gsm8k_ll_local.yaml").write_text(
        "task: gsm8k_ll_local\noutput_type: loglikelihood\ntest_split: test\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_target: \"{{' ' + answer.split('#### ')[-1]}}\"\n"
        "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}\n" + data_yaml(GSM8K))
    (out / "gen_mixed_local.yaml").write_text("group: gen_mixed_local\ntask:\n  - gsm8k_local\n  - gsm8k_ll_local\n")
    return out
