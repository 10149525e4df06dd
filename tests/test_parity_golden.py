"""raylm against lm-evaluation-harness 0.4.13's own output for its parity features (tests/golden/make_parity.py
made the golden; tests/parity_fixtures.py rebuilds what it ran on): chat templates zero-shot and few-shot
(multiturn and single-turn, a named template), system instructions, a PEFT adapter, HFLM's add_bos_token and
prefix_token_id, fractional --limit and --samples.

Every run builds raylm's requests as `raylm eval` does (native hellaswag, winogrande and wikitext; lm-eval's
arc_easy through its task layer) and scores them in-process with the real Scorer, then checks per request: the
(context, continuation) strings and the token ids HFLM scored (their SHA-256), the loglikelihood within the
golden README's tolerance, is_greedy; per task the metrics lm-eval reported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
from lm_eval.utils import sanitize_model_name
from parity_fixtures import ADAPTER, CHATML, GOLDEN_DIR, LLAMA3_STYLE, RUNS, STORIES, chat_model, merged_model, \
    parity_data, task_dir, tiny_gpt2, wikitext_data

from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.evaluate import run_lmeval_requests, run_prompt, run_selection, run_task_docs
from raylm.models.context import context_length
from raylm.models.loading import load_config, load_model
from raylm.models.spec import ModelSpec
from raylm.requests.driver import driver_encoder
from raylm.requests.native import encode_task_requests
from raylm.results.lmeval import results, task_scores
from raylm.results.metrics import choice_metrics
from raylm.scoring.scorer import Scorer
from raylm.scoring.sums import shard_sums
from raylm.tasks import get_task
from raylm.tasks.prompt import render

GOLDEN = json.loads((GOLDEN_DIR / "lmeval-0.4.13_parity.json").read_text())
NATIVE = {"hellaswag_parity": "hellaswag", "winogrande_parity": "winogrande", "wikitext_local": "wikitext"}


def sha(value) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


@pytest.fixture(scope="module")
def env(tmp_path_factory, local_tasks):
    root = tmp_path_factory.mktemp("parity")
    data = parity_data(root / "data")
    wikitext_data(data)
    models = {"chat": chat_model(root / "chat", {"default": LLAMA3_STYLE, "chatml": CHATML}),
              "chatml": chat_model(root / "chatml", CHATML), "stories": STORIES, "gpt2": tiny_gpt2(root / "gpt2")}
    return {"data": data, "tasks": task_dir(root / "tasks", data, local_tasks), "models": models, "root": root}


def config(env, run: dict, model: str | None = None, **changes) -> EvalConfig:
    spec = ModelSpec(str(env["models"][model or run["model"]]), "float32",
                     peft=str(ADAPTER) if run.get("peft") else None, add_bos_token=run.get("add_bos_token"),
                     prefix_token_id=run.get("prefix_token_id"))
    samples = {NATIVE.get(t, t): v for t, v in run["samples"].items()} if "samples" in run else None
    cfg = EvalConfig(spec, tuple(NATIVE.get(t, t) for t in run["tasks"]), env["data"], run.get("limit"),
                     run["num_fewshot"], include_path=env["tasks"], samples=samples,
                     apply_chat_template=run.get("apply_chat_template", False),
                     fewshot_as_multiturn=run.get("fewshot_as_multiturn"),
                     system_instruction=run.get("system_instruction"))
    return replace(cfg, **changes)


def raylm_run(cfg: EvalConfig, scorer: Scorer | None = None) -> dict:
    """raylm's requests (strings, token ids) and scores per golden task name, as `raylm eval` builds them."""
    encoder = driver_encoder(cfg.model)
    prompt = run_prompt(cfg, encoder.tokenizer)
    docs = run_task_docs(cfg)
    tables = encode_task_requests(docs, encoder, prompt)
    built = None
    selection = run_selection(cfg)
    if selection is not None:
        built, lmeval_tables = run_lmeval_requests(cfg, selection, encoder, prompt)
        tables.update(lmeval_tables)
    if scorer is None:
        config_ = load_config(cfg.model)
        scorer = Scorer(load_model(cfg.model), context_length(cfg.model, config_, "causal"))
    scored = {name: score_shard(scorer, kind, table).table for name, (kind, table) in tables.items()}
    out = {"prompt": prompt, "encoder": encoder, "tasks": {}, "metrics": {}}
    for name, (kind, table) in tables.items():
        rows = list(zip(table["doc_id"].to_pylist(), table["req_idx"].to_pylist(), table["context"].to_pylist(),
                        table["continuation"].to_pylist(), scored[name]["loglikelihood"].to_pylist(),
                        scored[name]["is_greedy"].to_pylist()))
        if kind == "multiple_choice":
            rendered = [render(d, prompt) for d in docs[name][0]]
            strings = [[c, k] for d in rendered for c, k in zip(d.contexts, d.continuations)]
            out["tasks"][name] = _choice_docs(rows, strings)
            out["metrics"][name] = choice_metrics(shard_sums(kind, scored[name]), get_task(name).choice_metrics)
        elif kind == "rolling":
            out["tasks"][name] = _rolling_docs(docs[name][0], rows, encoder)
        else:
            out["tasks"][name] = _lmeval_docs(built.requests(name), rows, encoder, built.indices(name))
    if built is not None:
        scores = {}
        for name in built.tasks["tasks"]:
            scores.update(task_scores(name, built.output_type(name), tables[name][1], scored[name]))
        out["metrics"].update(results(built, scores, 0, log_samples=False)["results"])
    return out


def _choice_docs(rows, strings) -> dict[int, list]:
    """Per doc_id: (strings, token ids, loglikelihood, is_greedy) of each request, in request order."""
    docs: dict[int, list] = {}
    for (doc_id, _, context, continuation, ll, greedy), arguments in zip(rows, strings, strict=True):
        docs.setdefault(doc_id, []).append((arguments, [context, continuation], ll, greedy))
    return docs


def _rolling_docs(task_docs, rows, encoder) -> dict[int, list]:
    """A page's text, its whole token list after the prefix token (as HFLM encodes it), its windows' sum."""
    return {doc.doc_id: [([doc.text], [[encoder.prefix_token], encoder.encode_many([doc.text])[0]],
                          sum(r[4] for r in rows if r[0] == doc.doc_id), None)] for doc in task_docs}


def _lmeval_docs(requests, rows, encoder, indices) -> dict[int, list]:
    """lm-eval's requests with their rows (a rolling request's windows summed), by the document's own index."""
    by_request: dict[tuple[int, int], list] = {}
    for row in rows:
        by_request.setdefault((row[0], row[1]), []).append(row)
    docs: dict[int, list] = {}
    for request in requests:
        mine = by_request[(request.doc_id, request.idx)]
        doc_id = indices[request.doc_id] if indices else request.doc_id
        if request.request_type == "loglikelihood_rolling":
            tokens = [[encoder.prefix_token], encoder.encode_many([request.arguments[0]])[0]]
            entry = (list(request.arguments), tokens, sum(r[4] for r in mine), None)
        else:
            entry = (list(request.arguments), [mine[0][2], mine[0][3]], mine[0][4], mine[0][5])
        docs.setdefault(doc_id, []).append(entry)
    return docs


@pytest.fixture(scope="module")
def scored(env):
    """raylm's run of each golden run, made once (several tests compare against the same one)."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            run = RUNS[name]
            cfg = config(env, run)
            if name == "chatml-1shot-multiturn":
                # The golden model has ChatML as its only template; raylm renders that template by name from the
                # model that holds it beside a default (lm-eval 0.4.13 would render that model's default there:
                # docs/parity.md, where raylm differs on purpose).
                cfg = config(env, run, model="chat", apply_chat_template="chatml")
            cache[name] = raylm_run(cfg)
        return cache[name]
    return get


@pytest.fixture(scope="module", params=sorted(RUNS))
def compared(request, scored):
    return request.param, GOLDEN["runs"][request.param], scored(request.param)


def test_requests_are_lm_evals_strings_and_token_ids(compared):
    name, golden, ours = compared
    for task, docs in golden["samples"].items():
        mine = ours["tasks"][NATIVE.get(task, task)]
        assert sorted(mine) == [d["doc_id"] for d in docs], (name, task)
        for doc in docs:
            requests = mine[doc["doc_id"]]
            if "arguments" in doc:  # in full, for a readable difference
                assert [r[0] for r in requests] == doc["arguments"], (name, task, doc["doc_id"])
            assert [sha(r[0]) for r in requests] == [r["arguments_sha"] for r in doc["requests"]], \
                (name, task, doc["doc_id"])
            assert [sha(r[1]) for r in requests] == [r["tokens_sha"] for r in doc["requests"]], \
                (name, task, doc["doc_id"])


def test_loglikelihoods_and_metrics_are_lm_evals(compared):
    name, golden, ours = compared
    for task, docs in golden["samples"].items():
        mine = ours["tasks"][NATIVE.get(task, task)]
        theirs = [r for d in docs for r in d["requests"]]
        lls = [r[2] for d in docs for r in mine[d["doc_id"]]]
        rtol = 1e-6 if task == "wikitext_local" else 2e-6
        np.testing.assert_allclose(lls, [r["loglikelihood"] for r in theirs], rtol=rtol, atol=1e-4,
                                   err_msg=f"{name} {task}")
        if task != "wikitext_local":
            assert [r[3] for d in docs for r in mine[d["doc_id"]]] == [r["is_greedy"] for r in theirs], (name, task)
            for metric in ("acc,none", "acc_norm,none"):
                if metric in golden["results"][task]:
                    assert ours["metrics"][NATIVE.get(task, task)][metric] == pytest.approx(
                        golden["results"][task][metric], abs=1e-12), (name, task, metric)
        assert golden["n-samples"][task]["effective"] == len(docs)


def test_the_template_raylm_records_is_the_one_lm_eval_records(compared):
    name, golden, ours = compared
    template = ours["prompt"].chat_template
    assert (template.source if template is not None else None) == golden["chat_template"], name
    assert (template.sha if template is not None else None) == golden["chat_template_sha"], name
    assert ours["encoder"].prefix_token == golden["prefix_token_id"], name


def lls(docs: dict[int, list]) -> np.ndarray:
    return np.array([r[2] for d in sorted(docs) for r in docs[d]])


CHOICE_RUN = {**RUNS["peft"], "tasks": ["hellaswag_parity", "winogrande_parity"]}


def test_an_adapter_scores_as_the_merged_model_does(env, scored):
    """PEFT: the adapter loaded onto the base (as HFLM runs it, unmerged) against peft's merge_and_unload, on
    every task of the golden adapter run; and it moves the scores away from the base's."""
    with_adapter = scored("peft")
    merged_dir = merged_model(env["root"] / "merged")
    merged = raylm_run(replace(config(env, RUNS["peft"]), model=ModelSpec(str(merged_dir), "float32")))
    base = raylm_run(replace(config(env, CHOICE_RUN), model=ModelSpec(str(STORIES), "float32")))
    env["fp32 base"] = base
    for task in with_adapter["tasks"]:
        np.testing.assert_allclose(lls(with_adapter["tasks"][task]), lls(merged["tasks"][task]), rtol=1e-5,
                                   atol=1e-4, err_msg=task)
    for task in base["tasks"]:
        assert np.abs(lls(with_adapter["tasks"][task]) - lls(base["tasks"][task])).max() > 1e-2, task


def test_a_4bit_base_takes_the_adapter(env, scored):
    """HFLM's load_in_4bit with peft=: the adapter sits on the quantised layers and moves the 4-bit model's scores
    as it moves the float32 model's."""
    cfg = config(env, CHOICE_RUN)
    base = env.get("fp32 base") or raylm_run(replace(cfg, model=replace(cfg.model, peft=None)))
    nf4_adapter = raylm_run(replace(cfg, model=replace(cfg.model, quantization="4bit")))
    nf4 = raylm_run(replace(cfg, model=replace(cfg.model, quantization="4bit", peft=None)))
    for task in nf4["tasks"]:
        moved_fp32 = lls(scored("peft")["tasks"][task]) - lls(base["tasks"][task])
        moved_nf4 = lls(nf4_adapter["tasks"][task]) - lls(nf4["tasks"][task])
        assert np.abs(moved_nf4).max() > 1e-2, task
        assert np.corrcoef(moved_fp32, moved_nf4)[0, 1] > 0.9, task


def test_unsorted_samples_select_the_same_documents(env, scored):
    """lm-eval evaluates --samples documents in file order; raylm sorts the indices, so each document also keeps
    its own index as doc_id (lm-eval 0.4.13 labels it by its place in the list given)."""
    run = RUNS["samples-2shot"]
    tasks = ["winogrande_parity", "arc_easy_local"]  # one native task, one through lm-eval's task layer
    shuffled = {task: list(reversed(run["samples"][task])) for task in tasks}
    ours = raylm_run(config(env, {**run, "tasks": tasks, "samples": shuffled}))["tasks"]
    assert ours == {NATIVE.get(t, t): scored("samples-2shot")["tasks"][NATIVE.get(t, t)] for t in tasks}


def test_an_lm_eval_command_line_runs_end_to_end_and_records_the_template(env, ray_session, tmp_path):
    """The golden chat run as a user types it with lm-eval's spellings, through Ray: lm-eval's metrics, and the
    template and its hash at the top of results.json under lm-eval's keys."""
    from raylm.cli import main

    golden = GOLDEN["runs"]["chat-2shot-multiturn"]
    out = tmp_path / "out"
    argv = ["eval", "--model", "hf", "--model_args", f"pretrained={env['models']['chat']},dtype=float32",
            "--tasks", "hellaswag,arc_easy_local", "--include_path", str(env["tasks"]), "--data-dir",
            str(env["data"]), "--apply_chat_template", "--fewshot_as_multiturn", "--num_fewshot", "2", "--limit", "8", "--output_path",
            str(out), "--log_samples", "--no-progress"]
    assert main(argv) == 0
    # raylm's folder for this command line, in lm-eval's layout
    [out] = (out / sanitize_model_name(str(env["models"]["chat"])) / ".raylm").iterdir()
    written = json.loads((out / "results.json").read_text())
    assert written["chat_template"] == golden["chat_template"]
    assert written["chat_template_sha"] == golden["chat_template_sha"]
    assert written["fewshot_as_multiturn"] is True and written["config"]["apply_chat_template"] is True
    for ours, theirs in (("hellaswag", "hellaswag_parity"), ("arc_easy_local", "arc_easy_local")):
        for metric in ("acc,none", "acc_norm,none"):
            assert written["results"][ours][metric] == pytest.approx(golden["results"][theirs][metric], abs=1e-12)
    import pyarrow.parquet as pq

    logged = pq.read_table(out / "samples" / "arc_easy_local.parquet").to_pylist()
    first = golden["samples"]["arc_easy_local"][0]
    assert [r["arguments"] for r in logged if r["doc_id"] == first["doc_id"]] == first["arguments"]


def test_simple_evaluate_on_raylm_renders_the_template_as_on_hflm(env, ray_session):
    """lm-eval's Python API with RayLM in HFLM's place: lm-eval renders the chat prompts through RayLM's
    apply_chat_template, and its numbers are the golden HFLM run's."""
    import lm_eval

    from raylm.api import RayLM
    from raylm.tasks.lmeval.names import select

    golden = GOLDEN["runs"]["chat-2shot-multiturn"]
    with RayLM(pretrained=str(env["models"]["chat"]), dtype="float32", actors=1) as lm:
        out = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy_local"], num_fewshot=2, limit=8,
                                      task_manager=select(["arc_easy_local"], env["tasks"]).manager,
                                      apply_chat_template=True, fewshot_as_multiturn=True, bootstrap_iters=0)
        assert lm.chat_template(True) == golden["chat_template"]
    for metric in ("acc,none", "acc_norm,none"):
        assert out["results"]["arc_easy_local"][metric] == pytest.approx(golden["results"]["arc_easy_local"][metric],
                                                                          abs=1e-12)
    first = golden["samples"]["arc_easy_local"][0]
    assert [list(a) for a in out["samples"]["arc_easy_local"][0]["arguments"]] == first["arguments"]
