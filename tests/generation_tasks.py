"""Offline lm-eval generate_until tasks for the tests: lm-eval's own gsm8k YAMLs with their data pointed at the
shared GSM8K (saved with `save_to_disk`), as a user passes them with --include-path.

- gsm8k_local, gsm8k_cot_local: lm-eval's gsm8k and gsm8k_cot unchanged but for the data;
- gsm8k_vote_local: gsm8k_cot_self_consistency (sampled, majority vote) at 8 repeats instead of 64 (its maj@8
  filter needs 8);
- gsm8k_ll_local: a loglikelihood task on the same documents, and gen_mixed_local, a group of it and gsm8k_local.
"""

from __future__ import annotations

from pathlib import Path

from conftest import DATA

GSM8K = DATA / "hf" / "openai" / "gsm8k" / "main"
NAMES = ("gsm8k_local", "gsm8k_cot_local", "gsm8k_vote_local", "gsm8k_ll_local", "gen_mixed_local")


def _lmeval_yaml(name: str) -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "gsm8k" / name


def _data() -> str:
    files = ", ".join(f"{split}: [{GSM8K / split / 'data-00000-of-00001.arrow'}]" for split in ("train", "test"))
    return f"dataset_path: arrow\ndataset_name: null\ndataset_kwargs:\n  data_files: {{{files}}}\n"


def write_generation_tasks(out: Path) -> Path:
    """The YAMLs above in `out` (an --include-path)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gsm8k_local.yaml").write_text(f"task: gsm8k_local\ninclude: {_lmeval_yaml('gsm8k.yaml')}\ntag: null\n"
                                          + _data())
    (out / "gsm8k_cot_local.yaml").write_text(
        f"task: gsm8k_cot_local\ninclude: {_lmeval_yaml('gsm8k-cot.yaml')}\ntag: null\n" + _data())
    (out / "gsm8k_vote_local.yaml").write_text(
        f"task: gsm8k_vote_local\ninclude: {_lmeval_yaml('gsm8k-cot-self-consistency.yaml')}\ntag: null\n"
        "repeats: 8\n" + _data())
    (out / "gsm8k_ll_local.yaml").write_text(
        "task: gsm8k_ll_local\noutput_type: loglikelihood\ntest_split: test\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_target: \"{{' ' + answer.split('#### ')[-1]}}\"\n"
        "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}\n" + _data())
    (out / "gen_mixed_local.yaml").write_text("group: gen_mixed_local\ntask:\n  - gsm8k_local\n  - gsm8k_ll_local\n")
    return out
