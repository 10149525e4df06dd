"""Make tests/goldens/lmeval_lowp.json: lm-evaluation-harness 0.4.13's own per-request loglikelihoods at bfloat16
and float16 for the stories260K golden model and the architecture matrix's tiny models, on the first documents of
HellaSwag and WinoGrande.

lm-eval runs through tests/golden/make_stories260K.py (the script that made the float32 goldens) with only HFLM's
dtype changed (bench/lmeval_at_dtype.py). What is kept per model and dtype: a digest of the weights, a digest of the
requests' strings, and lm-eval's loglikelihood for every request (bf16/fp16 values print short), so the file stays
small; the commands and versions go in with them.

    python tests/goldens/make_lmeval_lowp.py                      # needs the test extra (lm-eval); ~30 min on 2 cores
    python tests/goldens/make_lmeval_lowp.py --models tiny:llama --out /tmp/x.json
    python tests/goldens/make_lmeval_lowp.py --work /tmp/lowp     # resumable: lm-eval outputs there are reused
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from lowp_goldens import GOLDEN, TASKS, model_dir, requests_digest, weights_digest  # noqa: E402

LMEVAL_REF = TESTS / "golden" / "make_stories260K.py"
LMEVAL_AT_DTYPE = REPO / "bench" / "lmeval_at_dtype.py"
ROWS = {"stories260K": 60, "tiny": 16}  # documents per task; tiny models: HellaSwag's doc 32 does not fit 128 tokens
# lm-eval 0.4.13 finds no context length in MPT's config (it is `max_seq_len`), feeds the tiny MPT 2048-token inputs
# and crashes at its 128-position ALiBi bias; raylm reads max_seq_len. No lm-eval numbers exist for it to match.
LMEVAL_CANNOT = {"tiny:mpt"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def lmeval(model: Path, dtype: str, rows: int, out: Path) -> tuple[list[str], dict]:
    """lm-eval's output for the model at dtype; an output already in the work directory is reused."""
    cmd = [sys.executable, str(LMEVAL_AT_DTYPE), dtype, str(LMEVAL_REF), str(model),
           ",".join(f"{task}_local" for task in TASKS), str(out), "--limit", str(rows), "--bootstrap-iters", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if out.exists():
        return cmd, json.loads(out.read_text())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"lm-eval failed on {model} at {dtype}:\n{proc.stderr[-3000:]}")
    return cmd, json.loads(out.read_text())


def main() -> None:
    import tiny_families as fam
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(["stories260K", *(f"tiny:{f}" for f in fam.FAMILIES
                                                                       if f"tiny:{f}" not in LMEVAL_CANNOT)]))
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--out", type=Path, default=GOLDEN)
    parser.add_argument("--work", type=Path, help="lm-eval outputs and models: kept, and reused by a rerun")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="raylm-lowp-goldens-"))
    work.mkdir(parents=True, exist_ok=True)
    golden = {"made_by": f"python {Path(__file__).relative_to(REPO)}", "date": datetime.date.today().isoformat(),
              "machine": cpu_name(),
              "versions": {name: metadata.version(name) for name in ("lm_eval", "torch", "transformers")},
              "lmeval_script": "tests/golden/make_stories260K.py via bench/lmeval_at_dtype.py", "models": {}}
    for name in args.models.split(","):
        path = model_dir(name, work)
        rows = ROWS["tiny" if name.startswith("tiny:") else name]
        entry = {"weights_sha256": weights_digest(AutoModelForCausalLM.from_pretrained(path)), "rows": rows}
        for dtype in args.dtypes.split(","):
            cmd, out = lmeval(path, dtype, rows, work / f"{name.replace(':', '-')}-{dtype}.json")
            tasks = {}
            for task in TASKS:
                samples = sorted(out["samples"][f"{task}_local"], key=lambda s: s["doc_id"])
                tasks[task] = {"requests_sha256": requests_digest([s["arguments"] for s in samples]),
                               "loglikelihood": [s["loglikelihood"] for s in samples]}
            entry[dtype] = {"command": " ".join(Path(c).name if "/" in c else c for c in cmd[1:]), **tasks}
            print(f"{name} {dtype}: done", file=sys.stderr, flush=True)
        golden["models"][name] = entry
    golden["lmeval_cannot"] = {name: "lm-eval 0.4.13 reads no context length from MPT's config (max_seq_len)"
                               for name in sorted(LMEVAL_CANNOT)}
    args.out.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
