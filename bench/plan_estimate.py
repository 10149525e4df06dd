"""How close `--dry-run`'s time estimate comes to the run: for each workload, the dry run's estimated wall time on
this machine's CPU (plan.json's `cost.cpu.wall_s`, from raylm/cluster/estimate.py's CPU rate) next to the whole
command's measured wall time, run side by side in one invocation.

Workloads, each `raylm` with one CPU actor, float32:

- hellaswag: the native HellaSwag task, 0-shot, --rows documents;
- arc+mmlu 5-shot: lm-eval's arc_easy and all 57 MMLU subjects, 5-shot, --mmlu-limit documents per task, through
  the `<task>_local` YAMLs tests/offline_tasks.py writes (ARC-Easy from the tests' mirror, MMLU from the 57-subject
  mirror given by --mmlu-mirror, a folder holding `cais/mmlu/<subject>`);
- ppl: `raylm ppl` over the first --ppl-docs non-empty lines of WikiText-2's test split (1024-token windows).

Model: a seeded random 8-layer Llama of 26M parameters (hidden 512) with the stories260K tokenizer (512 ids), made
once under the bench cache: large enough that scoring, not start-up, is most of a run, and with its parameters in
its layers (a 512-id embedding) as the estimate's 2 FLOPs per parameter per token assumes.

    PYTHONPATH=$PWD python bench/plan_estimate.py --mmlu-mirror DIR
    PYTHONPATH=$PWD python bench/plan_estimate.py --mmlu-mirror DIR --quick   # a smoke run of a minute or two

The measured time is the whole command (interpreter start, Ray, model load, task building, scoring, exit); the
estimate is the scoring and a fixed start-up cost (raylm/cluster/estimate.py's CPU_RUN_START_S). Run it on a quiet
machine: anything else on the cores slows the run, not the estimate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CACHE, DATA, MK_LOCAL_TASKS, STORIES, env, print_table, timed  # noqa: E402

MAX_LENGTH = 1024


def llama_26m() -> Path:
    """The seeded random Llama above, made once and cached on disk."""
    path = CACHE / "llama-26m-stories-tokenizer"
    if not (path / "config.json").exists():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(STORIES)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=MAX_LENGTH,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        LlamaForCausalLM(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def local_tasks(mmlu_mirror: Path, out: Path) -> Path:
    """arc_easy_local (the tests' mirror) and the 57 mmlu_*_local subjects with their group (--mmlu-mirror)."""
    for mirror in (DATA / "hf", mmlu_mirror):
        subprocess.run([sys.executable, str(MK_LOCAL_TASKS), str(mirror), str(out)], env=env(), check=True,
                       capture_output=True)
    return out


def workloads(model: Path, args: argparse.Namespace, work: Path) -> dict[str, list[str]]:
    """Each workload's raylm command line, less --output and --dry-run."""
    common = ["--model", str(model), "--device", "cpu", "--dtype", "float32", "--no-progress"]
    tasks = local_tasks(args.mmlu_mirror, work / "tasks")
    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    corpus = work / "wikitext.jsonl"
    corpus.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines[:args.ppl_docs]), encoding="utf-8")
    return {
        f"hellaswag, {args.rows} docs": ["eval", *common, "--actors", "1", "--tasks", "hellaswag", "--data-dir",
                                         str(DATA), "--limit", str(args.rows)],
        f"arc_easy + mmlu (57) 5-shot, {args.mmlu_limit} docs each": [
            "eval", *common, "--actors", "1", "--tasks", "arc_easy_local,mmlu_local", "--include-path", str(tasks),
            "--num-fewshot", "5", "--limit", str(args.mmlu_limit)],
        f"ppl, {args.ppl_docs} WikiText-2 lines": ["ppl", *common, "--actors", "1", "--data", str(corpus),
                                                  "--max-length", str(MAX_LENGTH)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mmlu-mirror", type=Path, required=True,
                        help="a folder holding cais/mmlu/<subject> (save_to_disk folders) for all 57 subjects")
    parser.add_argument("--rows", type=int, default=200, help="HellaSwag documents")
    parser.add_argument("--mmlu-limit", type=int, default=2, help="documents per ARC/MMLU task")
    parser.add_argument("--ppl-docs", type=int, default=500, help="WikiText-2 lines for the perplexity run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tenth of each workload")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.mmlu_limit, args.ppl_docs = args.rows // 10, 1, args.ppl_docs // 10
    model = llama_26m()
    rows = []
    with tempfile.TemporaryDirectory(prefix="raylm-plan-estimate-") as tmp:
        work = Path(tmp)
        for n, (name, cmd) in enumerate(workloads(model, args, work).items()):
            plan_dir, run_dir = work / f"plan-{n}", work / f"run-{n}"
            timed([sys.executable, "-m", "raylm", *cmd, "--output", str(plan_dir), "--dry-run"], f"{name} dry run")
            plan = json.loads((plan_dir / "plan.json").read_text())
            estimated = plan["cost"]["cpu"]["wall_s"]
            measured = timed([sys.executable, "-m", "raylm", *cmd, "--output", str(run_dir)], name)
            computed = plan["corpus"]["computed"]["cpu"] if "corpus" in plan else plan["left"]["computed"]["cpu"]
            rows.append([name, f"{computed:,}", round(estimated, 1), round(measured, 1),
                         f"{estimated / measured:.2f}"])
    print_table(f"--dry-run's CPU estimate against the whole command ({plan['model']['parameters']:,} parameters, "
                f"{plan['cost']['cpu']['threads_per_actor']} torch threads)",
                ["run", "tokens computed", "estimated s", "measured s", "estimated / measured"], rows)


if __name__ == "__main__":
    main()
