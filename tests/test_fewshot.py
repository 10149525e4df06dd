"""Few-shot prompts against lm-eval 0.4.13 itself: its 5-shot WinoGrande golden output (prompts, loglikelihoods,
acc), its sampler on pools that hold the evaluated rows, and its own HellaSwag request building."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from conftest import DATA, STORIES
from fixture_data import FEW_SHOT, read_golden
from task_requests import build_task_requests

from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.data.rows import Row, read_jsonl
from raylm.errors import RaylmError
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.results.metrics import choice_metrics
from raylm.scoring.predictions import choice_predictions
from raylm.scoring.scorer import Scorer
from raylm.scoring.sums import shard_sums
from raylm.tasks import hellaswag, winogrande
from raylm.tasks.base import with_fewshot

SHOTS = 5
SCORED = 200


@pytest.fixture(scope="module")
def golden() -> dict:
    data = read_golden(FEW_SHOT)
    # How the golden was made: winogrande_local with its few-shot pool winogrande/train_s.jsonl, 5-shot.
    assert any("winogrande" in r["command"] and f"--num-fewshot {SHOTS}" in r["command"] for r in data["runs"])
    return data


def test_winogrande_pool_is_the_one_lm_eval_used(reference_tasks):
    """raylm takes the largest train_*.jsonl present; the golden's lm-eval task read train_s.jsonl."""
    yaml = (reference_tasks / "winogrande_local.yaml").read_text()
    assert f"train: {DATA / 'winogrande' / 'train_s.jsonl'}" in yaml
    pool = winogrande.load_fewshot_pool(DATA)
    assert [d.row_key for d in pool] == [r.content_key() for r in read_jsonl(DATA / "winogrande" / "train_s.jsonl")]


def test_winogrande_5shot_prompts_equal_lm_evals_character_for_character(golden):
    docs = with_fewshot(winogrande.TASK, winogrande.load_docs(DATA), winogrande.load_fewshot_pool(DATA), SHOTS,
                        seed=1234)
    samples = golden["samples"]["winogrande_local"]
    assert len(docs) == len(samples) == 1267
    for doc, sample in zip(docs, samples):
        assert [list(p) for p in zip(doc.contexts, doc.continuations)] == sample["arguments"], doc.doc_id


@pytest.fixture(scope="module")
def requests_5shot():
    spec = ModelSpec(str(STORIES), dtype="float32")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, ("winogrande",), DATA, num_fewshot=SHOTS), encoder)
    return model, encoder, tables["winogrande"][1]


def test_winogrande_5shot_loglikelihoods_and_predictions_equal_lm_evals(golden, requests_5shot):
    """The first SCORED documents (all 1,267 take minutes on 2 cores; they matched when run once): the same
    prompts, scored as lm-eval scored them."""
    model, encoder, table = requests_5shot
    table = table.slice(0, 2 * SCORED)
    shard = score_shard(Scorer(model, encoder.max_length), "multiple_choice", table)
    samples = golden["samples"]["winogrande_local"][:SCORED]
    ref = np.array([ll for s in samples for ll in s["loglikelihood"]])
    np.testing.assert_allclose(shard.table["loglikelihood"].to_numpy(), ref, rtol=2e-6, atol=1e-4)
    assert (choice_predictions(shard.table).pred == [int(np.argmax(s["loglikelihood"])) for s in samples]).all()


def test_winogrande_5shot_acc_from_lm_evals_loglikelihoods_is_lm_evals_acc(golden, requests_5shot):
    """raylm's predictions, sums and metrics on lm-eval's own per-request loglikelihoods of all 1,267 documents
    give lm-eval's acc and stderr."""
    _, _, table = requests_5shot
    lls = [ll for s in golden["samples"]["winogrande_local"] for ll in s["loglikelihood"]]
    scored = table.drop_columns(["context", "continuation"]).append_column("loglikelihood", pa.array(lls))
    metrics = choice_metrics(shard_sums("multiple_choice", scored), winogrande.TASK.choice_metrics)
    expected = golden["results"]["winogrande_local"]
    assert metrics["acc,none"] == expected["acc,none"]
    assert metrics["acc_stderr,none"] == pytest.approx(expected["acc_stderr,none"], rel=1e-9)


def wg_row(i: int, sentence: str) -> Row:
    return Row("mem", i + 1, {"sentence": sentence, "option1": "A", "option2": "B", "answer": "1"})


@pytest.mark.parametrize("seed", [0, 1234, 99])
def test_draws_equal_lm_evals_sampler_when_the_pool_holds_the_evaluated_rows(seed):
    """lm-eval's own ContextSampler, given each evaluated row as `eval_doc` (what it does when fewshot_split and
    test_split are both unset), on small pools where evaluated rows appear, some twice: the drop and the redraw."""
    from lm_eval.api.samplers import ContextSampler

    rnd = random.Random(seed)
    sentences = [f"s{i} _ end" for i in range(9)]
    pool_rows = [wg_row(i, s) for i, s in enumerate(sentences + sentences[:4])]
    eval_rows = [wg_row(i, rnd.choice(sentences)) for i in range(60)]
    k = 4
    sampler = ContextSampler([r.data for r in pool_rows], rnd=seed)
    docs = [winogrande.doc_from_row(i, r) for i, r in enumerate(eval_rows)]
    pool = [winogrande.doc_from_row(i, r) for i, r in enumerate(pool_rows)]
    by_key = {d.row_key: d for d in pool}
    shots = with_fewshot(winogrande.TASK, docs, pool, k, seed)
    for doc, shot, row in zip(docs, shots, eval_rows):
        drawn = [by_key[Row("lm-eval", 0, d).content_key()] for d in sampler.sample(k, eval_doc=row.data)]
        assert doc.row_key not in {d.row_key for d in drawn}
        prefix = "".join(q + " " + a + "\n\n" for q, a in (d.solved_example() for d in drawn))
        assert shot.contexts == tuple(prefix + c for c in doc.contexts)


def test_pool_too_small_for_lm_evals_extra_draw_is_refused():
    docs = winogrande.load_docs(DATA)[:2]
    pool = winogrande.load_fewshot_pool(DATA)
    with pytest.raises(RaylmError, match="needs a few-shot pool of at least 3 examples"):
        with_fewshot(winogrande.TASK, docs, pool[:2], 2, seed=1)
    assert with_fewshot(winogrande.TASK, docs, pool, 0, seed=1) == docs


LMEVAL_HELLASWAG = """
import json, os, sys
import lm_eval.tasks
from lm_eval.tasks import TaskManager, get_task_dict
folder, shots, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
include = os.path.join(os.path.dirname(lm_eval.tasks.__file__), "hellaswag", "hellaswag.yaml")
with open(os.path.join(folder, "hs_check.yaml"), "w") as f:
    f.write(f"task: hs_check\\ninclude: {include}\\ndataset_path: json\\ndataset_name: null\\n"
            f"dataset_kwargs:\\n  data_files:\\n    train: {folder}/train.jsonl\\n"
            f"    validation: {folder}/validation.jsonl\\n")
task = get_task_dict(["hs_check"], TaskManager(include_path=folder))["hs_check"]
task.set_config(key="num_fewshot", value=shots)
task.set_fewshot_seed(seed=seed)
task.build_all_requests(limit=None, rank=0, world_size=1)
docs = list(task.eval_docs)
lls = json.loads(open(os.path.join(folder, "lls.json")).read())
acc_norm = [[task.process_results(docs[int(d)], [(ll, False) for ll in row])["acc_norm"] for row in rows]
            for d, rows in lls.items()]
print(json.dumps({"requests": [[i.doc_id, i.idx, list(i.arguments)] for i in task.instances],
                  "acc_norm": acc_norm}))
"""
EMPTY_CHOICE_ROWS = [  # '[title]' is removed by preprocessing, leaving an empty choice
    {"activity_label": "Cooking", "ctx_a": "A man", "ctx_b": "cuts",
     "endings": ["[title]", "an onion.", "a cake.", "x"], "label": 0},
    {"activity_label": "Cooking", "ctx_a": "A man", "ctx_b": "cuts",
     "endings": ["an onion.", "[title]", "a cake.", "x"], "label": 1},
]
# Per empty-choice row: loglikelihoods of its four requests. The empty choice scores -inf per character (never the
# pick even with the best raw loglikelihood), or nan for a loglikelihood of exactly 0 (np.argmax's pick).
EMPTY_CHOICE_LLS = [[[-0.5, -16.8, -9.7, -18.5], [0.0, -1.0, -1.0, -1.0]],
                    [[-3.0, 0.0, -1.0, -1.0], [-0.5, -0.1, -20.0, -20.0]]]


@pytest.fixture(scope="module")
def lmeval_hellaswag(tmp_path_factory):
    """lm-eval's own hellaswag task (its YAML included unchanged, data from local files): its 5-shot requests for
    60 real rows plus EMPTY_CHOICE_ROWS, and its acc_norm for EMPTY_CHOICE_LLS on those two. Its training split,
    like the hub's, is the pool, and here it also holds 20 of the evaluated rows (3 of them twice), so the
    dropped evaluated document is exercised too."""
    folder = tmp_path_factory.mktemp("lmeval-hellaswag")
    lines = (DATA / "hellaswag" / "validation.jsonl").read_text().splitlines(keepends=True)
    (folder / "validation.jsonl").write_text("".join(lines[:60] + [json.dumps(r) + "\n" for r in EMPTY_CHOICE_ROWS]))
    (folder / "train.jsonl").write_text("".join(lines[100:180] + lines[:20] + lines[:3]))
    (folder / "lls.json").write_text(json.dumps({60 + i: lls for i, lls in enumerate(EMPTY_CHOICE_LLS)}))
    env = {**os.environ, "HF_HOME": str(folder / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", LMEVAL_HELLASWAG, str(folder), str(SHOTS), "1234"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    docs = [hellaswag.doc_from_row(i, r) for i, r in enumerate(read_jsonl(folder / "validation.jsonl"))]
    pool = [hellaswag.doc_from_row(i, r) for i, r in enumerate(read_jsonl(folder / "train.jsonl"))]
    return out, docs, pool


def test_hellaswag_fewshot_prompts_equal_lm_evals_own_requests(lmeval_hellaswag):
    out, docs, pool = lmeval_hellaswag
    expected = sorted(out["requests"], key=lambda r: (r[0], r[1]))
    shots = with_fewshot(hellaswag.TASK, docs, pool, SHOTS, 1234)
    ours = [[d.doc_id, i, [c, k]] for d in shots for i, (c, k) in enumerate(zip(d.contexts, d.continuations))]
    assert len(ours) == len(expected) == 248
    assert ours == expected


def test_an_empty_choice_ranks_in_acc_norm_as_in_lm_evals_process_results(lmeval_hellaswag):
    """Dividing by the empty choice's length 0 gives -inf (never the pick) or, for a loglikelihood of exactly 0,
    nan (np.argmax's pick): lm-eval's own process_results decides the same documents correct."""
    out, docs, _ = lmeval_hellaswag
    for doc, cases, expected in zip(docs[60:], EMPTY_CHOICE_LLS, out["acc_norm"]):
        assert 0 in doc.norm_lengths
        for lls, acc_norm in zip(cases, expected):
            table = pa.table({"doc_id": [doc.doc_id] * 4, "req_idx": list(range(4)), "gold": [doc.gold] * 4,
                              "norm_len": list(doc.norm_lengths), "loglikelihood": lls})
            assert shard_sums("multiple_choice", table)["correct_norm"] == acc_norm, (doc.gold, lls)
    assert out["acc_norm"] == [[0.0, 1.0], [1.0, 0.0]]
