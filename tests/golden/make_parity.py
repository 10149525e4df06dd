#!/usr/bin/env python3
"""Golden values from lm-evaluation-harness 0.4.13 for raylm's parity features: chat templates (zero-shot,
few-shot multiturn and single-turn, a named template), system instructions, PEFT adapters, HFLM's add_bos_token
and prefix_token_id, fractional --limit and --samples. Each run in tests/parity_fixtures.RUNS is lm-eval's own
simple_evaluate with HFLM (float32, CPU) on the models and data that module builds; its task YAMLs are
tests/offline_tasks.py's (the mirror's `<task>_local` and the reference wikitext_local) plus lm-eval's own
hellaswag and winogrande YAMLs pointed at small local subsets.

Per request it keeps the strings' and token ids' SHA-256 (the token ids exactly as HFLM.loglikelihood and
loglikelihood_rolling build them), their token counts, lm-eval's loglikelihood and is_greedy; the first two
documents' strings in full; per run the results, n-samples, and the chat template lm-eval records with its hash.

usage (needs lm-eval==0.4.13 and peft; HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1):
    python tests/golden/make_parity.py [--new-adapter] [RUN ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import parity_fixtures as fx  # noqa: E402

OUT = HERE / "lmeval-0.4.13_parity.json"
FULL_DOCS = 1  # documents per task whose strings are kept in full


def sha(value) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


def hflm_tokens(lm, request_type: str, arguments) -> list:
    """The token ids HFLM scores for one request: (context, continuation) as HFLM.loglikelihood encodes them
    (its empty-context branch included), or a rolling text's tokens with the prefix token in front."""
    if request_type == "loglikelihood_rolling":
        return [[lm.prefix_token_id], lm.tok_encode(arguments[0])]
    context, continuation = arguments
    if context == "":
        encoded = lm.tok_encode(continuation, add_special_tokens=False)
        if lm.prefix_token_id != encoded[0]:
            return [[lm.prefix_token_id], encoded]
        return [encoded[:1], encoded[1:]]
    return list(map(list, lm._encode_pair(context, continuation)))


def model_dirs(tmp: Path) -> dict[str, Path]:
    return {"chat": fx.chat_model(tmp / "chat", {"default": fx.LLAMA3_STYLE, "chatml": fx.CHATML}),
            "chatml": fx.chat_model(tmp / "chatml", fx.CHATML), "stories": fx.STORIES,
            "gpt2": fx.tiny_gpt2(tmp / "gpt2")}


def run_one(name: str, run: dict, models: dict[str, Path], tasks_dir: Path) -> dict:
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    model_args = {"pretrained": str(models[run["model"]]), "dtype": "float32"}
    for key in ("add_bos_token", "prefix_token_id"):
        if key in run:
            model_args[key] = run[key]
    if run.get("peft"):
        model_args["peft"] = str(fx.ADAPTER)
    lm = get_model("hf").create_from_arg_obj(model_args, {"batch_size": 1, "device": "cpu"})
    apply = run.get("apply_chat_template", False)
    res = lm_eval.simple_evaluate(
        model=lm, tasks=run["tasks"], num_fewshot=run["num_fewshot"], limit=run.get("limit"),
        samples=run.get("samples"), task_manager=TaskManager(include_path=str(tasks_dir)), log_samples=True,
        bootstrap_iters=0, apply_chat_template=apply, fewshot_as_multiturn=run.get("fewshot_as_multiturn", False),
        system_instruction=run.get("system_instruction"))
    template = lm.chat_template(apply) if apply else None
    out = {"settings": run, "chat_template": template, "chat_template_sha": sha_text(template),
           "prefix_token_id": lm.prefix_token_id,
           "results": {t: {k: v for k, v in r.items() if k != "alias"} for t, r in res["results"].items()},
           "n-samples": res["n-samples"], "samples": {}}
    for task, samples in res["samples"].items():
        docs = []
        for i, s in enumerate(samples):
            requests = []
            for arguments, resp in zip(s["arguments"], s["resps"]):
                first = resp[0]
                rolling = not isinstance(first, (list, tuple))
                arguments = list(arguments)
                tokens = hflm_tokens(lm, "loglikelihood_rolling" if rolling else "loglikelihood", arguments)
                requests.append({"arguments_sha": sha(arguments), "tokens_sha": sha(tokens),
                                 "n_tokens": [len(tokens[0]), len(tokens[1])],
                                 "loglikelihood": float(first if rolling else first[0]),
                                 "is_greedy": None if rolling else bool(first[1])})
            doc = {"doc_id": s["doc_id"], "requests": requests}
            if i < FULL_DOCS:
                doc["arguments"] = [list(a) for a in s["arguments"]]
            docs.append(doc)
        out["samples"][task] = docs
    print(name, json.dumps({t: {k: v for k, v in r.items() if "stderr" not in k} for t, r in out["results"].items()}))
    return out


def sha_text(text: str | None) -> str | None:
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", help="runs to (re)make (default: all)")
    ap.add_argument("--new-adapter", action="store_true", help="rebuild the LoRA kept in tests/golden first")
    a = ap.parse_args()
    if a.new_adapter or not (fx.ADAPTER / "adapter_config.json").is_file():
        fx.make_adapter(fx.ADAPTER)
    golden = json.loads(OUT.read_text()) if OUT.is_file() else {"runs": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = fx.parity_data(tmp / "data")
        tasks_dir = fx.task_dir(tmp / "tasks", data)
        models = model_dirs(tmp / "models")
        import lm_eval

        golden["lm_eval"] = lm_eval.__version__
        for name in a.runs or list(fx.RUNS):
            golden["runs"][name] = run_one(name, fx.RUNS[name], models, tasks_dir)
    OUT.write_text(json.dumps(golden, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
