"""lm-eval's generate_until tasks from the task layer to results, without a model: the generation tables against
HFLM's own encoding, truncation and stop strings on real GSM8K prompts; fixed generations through raylm's results
path against lm-eval's own simple_evaluate around a model that answers with the same texts (regex filters,
majority vote over repeats, a group mixing generation and loglikelihood); and the one-line refusals."""

from __future__ import annotations

import json
from collections import Counter

import lm_eval
import numpy as np
import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest
from conftest import STORIES
from generation_tasks import write_generation_tasks
from lm_eval.api.model import LM
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable

from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.generation import ModelSampling, generation_table, request_seed
from raylm.requests.lmeval import request_tables
from raylm.requests.order import restore
from raylm.requests.shards import LMEVAL_KIND, make_shards
from raylm.results.lmeval import results, task_scores
from raylm.results.lmeval_samples import docs_table, requests_table
from raylm.tasks.lmeval.build import Request, documents, load_and_build
from raylm.tasks.lmeval.names import select

SEEDS = (0, 1234, 1234, 1234)


@pytest.fixture(scope="module")
def gen_tasks(tmp_path_factory):
    return write_generation_tasks(tmp_path_factory.mktemp("gen-tasks"))


def fixed_texts(built) -> dict[tuple[str, int, int, int], str]:
    """A generation per (task, doc_id, idx, repeat) that the gsm8k filters treat in every way: the gold answer in
    the strict `#### n` form, in the CoT `The answer is n.` form, a wrong number, and no number at all."""
    rng = np.random.default_rng(0)
    out = {}
    for task in built.tasks["tasks"]:
        if built.output_type(task) != "generate_until":
            continue
        obj = built.tasks["tasks"][task]
        golds = {doc_id: doc["answer"].split("#### ")[-1] for doc_id, _, doc in
                 documents(obj, built.limits[task], built.indices(task))}
        for r in built.requests(task):
            for repeat in range(r.repeats):
                gold = golds[r.doc_id]
                out[(task, r.doc_id, r.idx, repeat)] = [
                    f" Natalia sold {gold} clips.\n#### {gold}", f" So she has {gold} left. The answer is {gold}.",
                    " The answer is 1,234.", " I do not know.", f" ${gold}.00"][int(rng.integers(5))]
    return out


class ReplayLM(LM):
    """An lm-eval model that answers generations with the fixed texts (a request sent `repeats` times gets its
    repeats in order) and likelihoods from a table, checking each request's arguments are raylm's."""

    def __init__(self, texts: dict, scores: dict, arguments: dict):
        super().__init__()
        self.texts, self.scores, self.arguments = texts, scores, arguments

    def generate_until(self, requests):
        sent: Counter = Counter()
        out = []
        for req in requests:
            key = (req.task_name, req.doc_id, req.idx)
            assert req.args == self.arguments[key]
            out.append(self.texts[(*key, sent[key])])
            sent[key] += 1
        return out

    def loglikelihood(self, requests):
        for req in requests:
            assert req.args == self.arguments[(req.task_name, req.doc_id, req.idx)]
        return [self.scores[(req.task_name, req.doc_id, req.idx)] for req in requests]

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def scored_generations(texts: dict, task: str) -> pa.Table:
    """What a task's generation shards bring back, in a scrambled order (restore puts rows back by key)."""
    rows = sorted(((d, i, r, text) for (t, d, i, r), text in texts.items() if t == task), reverse=True)
    d, i, r, text = zip(*rows)
    return pa.table({"doc_id": pa.array(d, pa.int64()), "req_idx": pa.array(i, pa.int32()),
                     "repeat": pa.array(r, pa.int32()), "generation": pa.array(text, pa.string()),
                     "generated_tokens": pa.array([len(t) for t in text], pa.int32()),
                     "context_tokens": pa.array([7] * len(text), pa.int32())})


@pytest.mark.parametrize("names,gen_kwargs", [(["gsm8k_local", "gsm8k_vote_local"], {"max_gen_toks": 17}),
                                              (["gen_mixed_local"], None)])
def test_raylms_results_for_fixed_generations_are_lm_evals_own(gen_tasks, names, gen_kwargs):
    built = load_and_build(select(names, gen_tasks), SEEDS, None, 6, gen_kwargs=gen_kwargs)
    texts = fixed_texts(built)
    rng = np.random.default_rng(1)
    scores, arguments = {}, {}
    for task in built.tasks["tasks"]:
        for r in built.requests(task):
            arguments[(task, r.doc_id, r.idx)] = r.arguments
            if r.request_type != "generate_until":
                scores[(task, r.doc_id, r.idx)] = (float(-rng.gamma(2.0, 10.0)), bool(rng.random() < 0.5))
    for task in built.tasks["tasks"]:
        if built.output_type(task) == "generate_until":
            scores.update(task_scores(task, "generate_until", pa.table({}), scored_generations(texts, task)))
    ours = results(built, scores, 200)
    theirs = lm_eval.simple_evaluate(model=ReplayLM(texts, scores, arguments), tasks=names,
                                     task_manager=TaskManager(include_path=str(gen_tasks), include_defaults=False),
                                     limit=6,
                                     bootstrap_iters=200, gen_kwargs=gen_kwargs, random_seed=SEEDS[0],
                                     numpy_random_seed=SEEDS[1], torch_random_seed=SEEDS[2],
                                     fewshot_random_seed=SEEDS[3])
    for key in ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                "n-samples", "samples"):
        assert json.dumps(ours.get(key), default=handle_non_serializable) == \
            json.dumps(theirs.get(key), default=handle_non_serializable), key
    if "gsm8k_vote_local" in names:
        votes = ours["results"]["gsm8k_vote_local"]
        assert {"exact_match,score-first", "exact_match,maj@64", "exact_match,maj@8"} <= set(votes)
        assert ours["configs"]["gsm8k_local"]["generation_kwargs"]["max_gen_toks"] == 17
        assert len(ours["samples"]["gsm8k_vote_local"][0]["resps"][0]) == 8  # a text per repeat
    else:
        assert "gen_mixed_local" in ours["group_subtasks"] and "gsm8k_ll_local" in ours["results"]
    for task, samples in ours["samples"].items():
        docs = docs_table(samples)
        if task != "gsm8k_ll_local":
            assert docs["resps"].to_pylist() == [s["resps"] for s in samples]
            generations = requests_table(task, samples, scored_generations(texts, task))
            first_filter = [s for s in samples if s["filter"] == samples[0]["filter"]]
            assert generations["generations"].to_pylist() == [r for s in first_filter for r in s["resps"]]
        assert docs["filtered_resps"].to_pylist() == [json.dumps(s["filtered_resps"], ensure_ascii=False)
                                                      for s in samples]


def test_think_end_token_strips_each_generation_as_hflm_does(gen_tasks):
    """HFLM's think_end_token: each answer is what follows the token's last occurrence, before any filter. raylm's
    results for generations with thinking (cut at their stop strings, as raylm's engine returns them) are lm-eval's
    own around a model whose answers are HFLM's post-processing of the same raw generations."""
    from lm_eval.models.utils import postprocess_generated_text

    from raylm.config import EvalConfig
    from raylm.evaluate.driver import _lmeval_results
    from raylm.results.eval_result import TaskResult
    from raylm.results.report import thinking_record

    task, think = "gsm8k_local", "</think>"
    built = load_and_build(select([task], gen_tasks), SEEDS, None, 6)
    until = {(r.doc_id, r.idx): handle_stop_sequences(list(r.arguments[1]["until"]), eos="<|endoftext|>")
             for r in built.requests(task)}
    wraps = ("<think>\nSo 2 + 2 = 5?\n</think>\n\n", "", "a</think>b</think> \n", "Thinking.</think>")
    raw = {key: wraps[i % len(wraps)] + text for i, (key, text) in enumerate(sorted(fixed_texts(built).items()))}
    engine = {}  # raylm's engine returns each generation cut at its stop strings (final_text)
    for key, text in raw.items():
        for term in until[key[1:3]]:
            text = text.split(term)[0]
        engine[key] = text
    requests = pa.table({"doc_id": [d for d, _ in until], "req_idx": [i for _, i in until],
                         "until": list(until.values())})
    cfg = EvalConfig(ModelSpec(str(STORIES)), (task,), think_end_token=think, bootstrap_iters=200, log_samples=True)
    ours = _lmeval_results(cfg, built, {task: (LMEVAL_KIND, requests)},
                           {task: TaskResult(task, LMEVAL_KIND, {}, {}, 0, scored_generations(engine, task))}, None)
    hflm = {key: postprocess_generated_text(text, until[key[1:3]], think) for key, text in raw.items()}
    assert hflm != engine
    arguments = {(task, r.doc_id, r.idx): r.arguments for r in built.requests(task)}
    theirs = lm_eval.simple_evaluate(model=ReplayLM(hflm, {}, arguments), tasks=[task], limit=6, bootstrap_iters=200,
                                     task_manager=TaskManager(include_path=str(gen_tasks), include_defaults=False),
                                     random_seed=SEEDS[0], numpy_random_seed=SEEDS[1], torch_random_seed=SEEDS[2],
                                     fewshot_random_seed=SEEDS[3], log_samples=True)
    for key in ("results", "samples"):
        assert json.dumps(ours[key], default=handle_non_serializable) == \
            json.dumps(theirs[key], default=handle_non_serializable), key
    assert thinking_record(cfg) == {"think_end_token": think}  # results.json's config says how answers were cut


def test_enable_thinking_refuses_loglikelihood_tasks_as_hflm_does(gen_tasks):
    """HFLM refuses loglikelihood requests under enable_thinking=True (and needs think_end_token with it); its
    generation tasks run."""
    from raylm.config import EvalConfig
    from raylm.tasks.prompt import PromptFormat

    thinking = PromptFormat(thinking=True)
    with pytest.raises(RaylmError, match=r"not compatible with loglikelihood tasks .*: gsm8k_ll_local$"):
        load_and_build(select(["gen_mixed_local"], gen_tasks), SEEDS, None, 2, prompt=thinking)
    assert load_and_build(select(["gsm8k_local"], gen_tasks), SEEDS, None, 2, prompt=thinking).requests("gsm8k_local")
    model = ModelSpec(str(STORIES))
    for fields, message in (({"enable_thinking": True}, "needs think_end_token"),
                            ({"think_end_token": 151668}, "is a token id"),
                            ({"enable_thinking": True, "think_end_token": "</think>", "tasks": ("gsm8k", "hellaswag")},
                             "triggered by task.s.: hellaswag$")):
        with pytest.raises(RaylmError, match=message):
            EvalConfig(model, **{"tasks": ("gsm8k",), **fields}).validate()


def hflm_contexts(lm: HFLM, prompts: list[str], room: int) -> list[list[int]]:
    """HFLM.tok_batch_encode's left-padded, left-truncated batch, each row's padding dropped."""
    ids, mask = lm.tok_batch_encode(prompts, left_truncate_len=room)
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


@pytest.mark.parametrize("model", ["tiny_gpt2", "tiny_llama"])
def test_generation_tables_are_hflms_encoding_truncation_and_stop_strings(gen_tasks, model, request):
    path = request.getfixturevalue(model)
    lm = HFLM(pretrained=str(path), device="cpu", batch_size=1)
    built = load_and_build(select(["gsm8k_local", "gsm8k_vote_local"], gen_tasks), SEEDS, None, 3,
                           gen_kwargs={"max_gen_toks": 32})
    encoder = Encoder(lm.tokenizer, lm.max_length)
    model_sampling = ModelSampling.of(lm.model.generation_config, str(path))
    tables = request_tables(built, encoder, lambda: model_sampling, SEEDS[2])
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    for task, table in tables.items():
        requests = built.requests(task)
        prompts = [r.arguments[0] for r in requests for _ in range(r.repeats)]
        room = lm.max_length - 32
        assert table["context"].to_pylist() == hflm_contexts(lm, prompts, room)
        assert max(len(lm.tok_encode(p)) for p in prompts) > room  # the 5- and 8-shot prompts are cut
        until = handle_stop_sequences(list(requests[0].arguments[1]["until"]), eos)
        assert set(map(tuple, table["until"].to_pylist())) == {tuple(until)}
        assert set(table["max_gen_toks"].to_pylist()) == {32}
        repeats = requests[0].repeats
        assert table["repeat"].to_pylist() == list(range(repeats)) * len(requests)
        sampling = set(zip(*(table[c].to_pylist() for c in ("do_sample", "temperature", "top_k", "top_p"))))
        # gsm8k is greedy; the self-consistency task samples at 0.2 with HF's default top_k and top_p
        assert sampling == ({(False, 1.0, 0, 1.0)} if task == "gsm8k_local" else {(True, 0.2, 50, 1.0)})
        assert table["seed"].to_pylist() == [request_seed(SEEDS[2], task, r.doc_id, r.idx, k)
                                             for r in requests for k in range(r.repeats)]
        # whole documents per shard, in token order, and every row back in place by its key
        shards = make_shards({task: (LMEVAL_KIND, table)}, 2)
        for shard in shards:
            ids = shard.table["doc_id"].to_pylist()
            assert all(ids.count(d) == table["doc_id"].to_pylist().count(d) for d in set(ids))
        back = restore(pa.concat_tables(s.table for s in shards), table, task)
        assert back.equals(table)


def test_seeds_depend_on_the_generation_not_on_its_place():
    seeds = {request_seed(1234, "t", d, i, r) for d in range(3) for i in range(2) for r in range(3)}
    assert len(seeds) == 18 and request_seed(1234, "t", 0, 0, 0) != request_seed(1, "t", 0, 0, 0)
    assert all(0 <= s < 2**63 for s in seeds)


def test_unimplemented_generation_arguments_are_refused_in_one_line(tiny_gpt2):
    from transformers import AutoTokenizer, GenerationConfig

    encoder = Encoder(AutoTokenizer.from_pretrained(tiny_gpt2), 128)
    ask = {"until": ["\n"], "do_sample": False}
    for extra, message in (({"num_beams": 4}, r"^gsm8k_x \(document 3\): generation argument num_beams=4 is not "
                                              r"implemented by raylm's generation engine \(it takes until, "),
                           ({"max_gen_toks": 128}, r"max_gen_toks 128 leaves no room for a prompt in the model's "
                                                   r"max length 128"),
                           ({"do_sample": True, "temperature": 0.0}, "HF generate refuses a temperature")):
        with pytest.raises(RaylmError, match=message) as raised:
            generation_table([Request("gsm8k_x", 3, 0, "generate_until", ("Q: 1+1?", {**ask, **extra}))],
                             encoder, ModelSampling(), 0)
        assert "\n" not in str(raised.value)
    with pytest.raises(RaylmError, match=r"^model 'm': its generation_config sets repetition_penalty=1.1, which "):
        ModelSampling.of(GenerationConfig(repetition_penalty=1.1), "m")
    assert ModelSampling.of(GenerationConfig(top_k=20, top_p=0.9), "m") == ModelSampling(1.0, 20, 0.9)


def test_a_mixed_gsm8k_group_on_an_actor_is_hflms_and_resumes_from_its_checkpoint(ray_session, tiny_gpt2, gen_tasks,
                                                                                   tmp_path):
    """The one run on real actors: gsm8k (5-shot prompts cut to fit, greedy) beside a loglikelihood task in one
    group, 2 documents in shards of one request; lm-eval's HFLM on the same model generates the same texts, and
    so does RayLM under lm-eval's simple_evaluate. A second run, its first generation shard's checkpoint gone,
    resumes the other shards and generates that one again, to the same results."""
    import ray

    from raylm.api import RayLM
    from raylm.cluster.runtime import start_actors
    from raylm.config import EvalConfig
    from raylm.evaluate import evaluate
    from raylm.models.spec import ModelSpec
    from raylm.results.report import write_samples

    spec = ModelSpec(str(tiny_gpt2), dtype="float32", device="cpu")
    cfg = EvalConfig(spec, ("gen_mixed_local",), include_path=gen_tasks, limit=2, shard_requests=1, progress=False,
                     output=tmp_path / "out", log_samples=True, bootstrap_iters=0, gen_kwargs={"max_gen_toks": 12})
    actors = start_actors(spec, 1, None)
    try:
        first = evaluate(cfg, actors)
        # as if the run had been killed before its first generation shard was checkpointed
        (tmp_path / "out" / "checkpoint" / "shards" / "000000.parquet").unlink()
        again = evaluate(cfg, actors)
    finally:
        for actor in actors:
            ray.kill(actor)
    with RayLM(pretrained=str(tiny_gpt2), actors=1, dtype="float32", device="cpu") as ray_lm:
        via_api = lm_eval.simple_evaluate(model=ray_lm, tasks=["gsm8k_local"], limit=2, bootstrap_iters=0,
                                          task_manager=TaskManager(include_path=str(gen_tasks),
                                                                   include_defaults=False),
                                          gen_kwargs={"max_gen_toks": 12}, log_samples=True)
    lm = HFLM(pretrained=str(tiny_gpt2), device="cpu", batch_size=1, dtype="float32")
    theirs = lm_eval.simple_evaluate(model=lm, tasks=["gen_mixed_local"], limit=2, bootstrap_iters=0,
                                     task_manager=TaskManager(include_path=str(gen_tasks), include_defaults=False),
                                     gen_kwargs={"max_gen_toks": 12}, log_samples=True)
    ours = first.lmeval
    assert [s["resps"] for s in ours["samples"]["gsm8k_local"]] == \
        [s["resps"] for s in theirs["samples"]["gsm8k_local"]]
    assert [s["filtered_resps"] for s in ours["samples"]["gsm8k_local"]] == \
        [s["filtered_resps"] for s in theirs["samples"]["gsm8k_local"]]
    assert ours["results"]["gsm8k_local"] == theirs["results"]["gsm8k_local"]
    assert [s["resps"] for s in via_api["samples"]["gsm8k_local"]] == \
        [s["resps"] for s in theirs["samples"]["gsm8k_local"]]
    assert ours["results"]["gsm8k_ll_local"]["acc,none"] == theirs["results"]["gsm8k_ll_local"]["acc,none"]
    assert ours["results"]["gsm8k_ll_local"]["perplexity,none"] == \
        pytest.approx(theirs["results"]["gsm8k_ll_local"]["perplexity,none"], rel=1e-5)
    assert first.tasks["gsm8k_local"].sums["docs"] == 2 and first.tasks["gsm8k_local"].sums["generated_tokens"] > 0
    assert first.extra["shards"] == 4 and again.extra["shards_resumed"] == 3 and again.extra["requests_scored"] == 1
    assert again.lmeval["samples"]["gsm8k_local"] == ours["samples"]["gsm8k_local"]
    assert again.lmeval["results"] == ours["results"]
    regenerated = pa.parquet.read_table(tmp_path / "out" / "checkpoint" / "shards" / "000000.parquet")
    assert "generation" in regenerated.schema.names
    write_samples(tmp_path / "out", first)
    docs = pa.parquet.read_table(tmp_path / "out" / "samples" / "gsm8k_local_docs.parquet")
    assert docs["resps"].to_pylist()[:2] == [s["resps"] for s in ours["samples"]["gsm8k_local"]][:2]
    assert len(list((tmp_path / "out" / "samples").glob("samples_gsm8k_local_*.jsonl"))) == 1


def test_chat_prompts_are_hflms_and_encoded_without_a_second_bos(gen_tasks, tmp_path):
    """Under a chat template that writes BOS itself, the prompts (a user turn, the generation prompt) are the
    ones lm-eval builds with HFLM's apply_chat_template, and encoded as tok_batch_encode encodes them: no
    special tokens added, so BOS stays single."""
    from parity_fixtures import LLAMA3_STYLE, chat_model

    from raylm.requests.driver import prompt_format
    from raylm.tasks.prompt import PromptFormat

    lm = HFLM(pretrained=str(chat_model(tmp_path / "chat", LLAMA3_STYLE)), device="cpu", batch_size=1)
    prompt = prompt_format(lm.tokenizer, apply_chat_template=True, multiturn=True)
    room = {"max_gen_toks": 64}
    ours = load_and_build(select(["gsm8k_local"], gen_tasks), SEEDS, 0, 3, prompt=prompt, gen_kwargs=room)
    theirs = load_and_build(select(["gsm8k_local"], gen_tasks), SEEDS, 0, 3,
                            prompt=PromptFormat(None, lm.apply_chat_template, True), gen_kwargs=room)
    requests = ours.requests("gsm8k_local")
    assert [r.arguments for r in requests] == [r.arguments for r in theirs.requests("gsm8k_local")]
    prompts = [r.arguments[0] for r in requests]
    assert all(p.startswith(lm.tokenizer.bos_token) and "<|start_header_id|>assistant" in p for p in prompts)
    table, cut = generation_table(requests, Encoder(lm.tokenizer, lm.max_length), ModelSampling(), 0)
    contexts = table["context"].to_pylist()
    assert contexts == hflm_contexts(lm, prompts, lm.max_length - 64)
    assert cut == 0 and [c.count(lm.tokenizer.bos_token_id) for c in contexts] == [1, 1, 1]
