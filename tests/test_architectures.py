"""The architecture matrix: for every causal-LM family users evaluate, packed shared-prefix scoring against scoring
each request alone and the float64 one-request reference, on real rows; the KL and corpus scorers the same way;
negative controls showing the comparison catches a wrong mask; the LM-head guard; the start-up check that decides
for models no test proves (remote-code stand-ins); and the attention implementation raylm loads with.

Models are tiny seeded random ones (tests/tiny_families.py) built offline, saved and loaded through raylm's own
loader (from_pretrained), shared across the tests of this module.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import tiny_families as fam
import torch
import transformers
from conftest import DATA, STORIES
from fixture_data import FEW_SHOT, read_golden
from reference import float64_copy, reference_score
from reference_corpus import reference_kl, reference_strided_nll
from transformers import AutoTokenizer

from raylm.cluster.scoring_actor import ScoringActor
from raylm.corpus import doc_scoring
from raylm.corpus.doc_scoring import DocPerplexity
from raylm.scoring.documents import PREFIX_SHARING_COLUMN
from raylm.models.loading import load_implementation, load_model
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.table import build_requests
from raylm.requests.windows import strided_windows
from raylm.scoring.attention import ONE_TENSOR, AttentionPlan, attention_plan
from raylm.scoring.kl import KLScorer
from raylm.scoring.scorer import HeadMisuse, Scorer
from raylm.scoring.startup_check import checked_plan, packing_check
from raylm.tasks import get_task

MAX_LENGTH = fam.CONTEXT
STRIDE = 64
# Real documents: HellaSwag's first 8 (a quarter are left-truncated at 128 tokens) and two of its shortest;
# WinoGrande's six with contexts under 16 tokens (inside every window) and its first four.
DOCS = {"hellaswag": [0, 1, 2, 3, 4, 5, 6, 7, 217, 96], "winogrande": [1046, 704, 555, 556, 462, 406, 0, 1, 2, 3]}
ATOL_PER_TOKEN, RTOL = 1e-4, 1e-5  # float32 vs float64, and packed vs alone, per request
WRONG = 0.1  # nats: a wrong mask moves some request by at least this much (1.5-41 nats measured)

FAMILIES = list(fam.FAMILIES)
SDPA, EAGER = "sdpa", "eager"
WINDOW, DICT = ((ONE_TENSOR, fam.WINDOW),), (("full_attention", None), ("sliding_attention", fam.WINDOW))
PLAIN = ((ONE_TENSOR, None),)
# family -> (implementation raylm loads it with, packed?, mask layout of a packed row)
EXPECTED = {
    "gpt2": (SDPA, True, PLAIN), "llama": (SDPA, True, PLAIN), "mistral": (SDPA, True, WINDOW),
    "qwen2": (SDPA, True, DICT), "gemma2": (EAGER, True, DICT), "gemma3": (SDPA, True, DICT),
    "gpt_neox": (SDPA, True, PLAIN), "opt": (SDPA, True, PLAIN), "phi": (SDPA, True, PLAIN),
    "phi3": (SDPA, True, WINDOW), "falcon": (SDPA, True, PLAIN), "falcon_alibi": (SDPA, False, PLAIN),
    "bloom": (EAGER, False, PLAIN), "mpt": (EAGER, False, PLAIN), "gptj": (SDPA, True, PLAIN),
    "olmo": (SDPA, True, PLAIN), "olmo2": (SDPA, True, PLAIN), "cohere2": (SDPA, True, DICT),
}
WINDOWED = [f for f, (_, _, masks) in EXPECTED.items() if any(w is not None for _, w in masks)]
ALIBI = ["falcon_alibi", "bloom", "mpt"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    yield
    torch.set_num_threads(before)
    transformers.utils.logging.enable_progress_bar()


class Zoo:
    """Each family built once, loaded through raylm's loader, with its float64 copy and per-request references."""

    def __init__(self, root: Path, requests):
        self.root, self.requests = root, requests
        self._paths: dict[tuple[str, int], Path] = {}
        self._models: dict[tuple[str, int], torch.nn.Module] = {}
        self._model64: dict[tuple[str, int], torch.nn.Module] = {}
        self._refs: dict[str, np.ndarray] = {}

    def path(self, family: str, seed: int = 0) -> Path:
        if (family, seed) not in self._paths:
            path = fam.build(family, self.root, seed)
            AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
            self._paths[family, seed] = path
        return self._paths[family, seed]

    def spec(self, family: str, seed: int = 0) -> ModelSpec:
        return ModelSpec(str(self.path(family, seed)), dtype="float32", device="cpu")

    def model(self, family: str, seed: int = 0) -> torch.nn.Module:
        if (family, seed) not in self._models:
            self._models[family, seed] = load_model(self.spec(family, seed))
        return self._models[family, seed]

    def model64(self, family: str, seed: int = 0) -> torch.nn.Module:
        if (family, seed) not in self._model64:
            self._model64[family, seed] = float64_copy(self.model(family, seed))
        return self._model64[family, seed]

    def reference(self, family: str) -> np.ndarray:
        if family not in self._refs:
            model64 = self.model64(family)
            contexts, continuations = self.requests
            self._refs[family] = np.array([reference_score(model64, c, k, MAX_LENGTH)[0]
                                           for c, k in zip(contexts, continuations)])
        return self._refs[family]


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(AutoTokenizer.from_pretrained(STORIES), MAX_LENGTH)


@pytest.fixture(scope="module")
def real_table(encoder) -> pa.Table:
    """60 real requests as raylm's request code builds them (WinoGrande's doc ids moved past HellaSwag's)."""
    tables = []
    for offset, (name, wanted) in enumerate(DOCS.items()):
        task = get_task(name)
        docs = task.load_docs(DATA)
        table = build_requests(task, [docs[i] for i in wanted], encoder)
        doc_id = pa.array([offset * 100_000 + d for d in table["doc_id"].to_pylist()],
                          table.schema.field("doc_id").type)
        tables.append(table.set_column(table.schema.get_field_index("doc_id"), "doc_id", doc_id))
    return pa.concat_tables(tables)


@pytest.fixture(scope="module")
def real(real_table):
    """(contexts, continuations) of the real requests."""
    return real_table["context"].to_pylist(), real_table["continuation"].to_pylist()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory, real) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("families"), real)


@pytest.fixture(scope="module")
def corpus_texts() -> list[str]:
    """WikiText-2: a document spanning several strided windows, one about a window long, and three headings a few
    tokens long, which share their first words over more than 1/8 of their length and so get packed into one row
    (with every family's tokenizer: Qwen2's drops the stories vocabulary's " = ")."""
    text = (DATA / "wikitext-2" / "test.txt").read_text()
    return [text[:1200], text[5000:5260], " = Robert Boulter = ", " = Robert Boulter : Career = ",
            " = Robert Boulter : 2000 – 2005 = "]


def within(diff: np.ndarray, n_tokens: np.ndarray, reference: np.ndarray) -> bool:
    return bool(np.all(diff <= ATOL_PER_TOKEN * n_tokens + RTOL * np.abs(reference)))


def score(scorer: Scorer, requests) -> np.ndarray:
    return scorer.score(*requests)[0]


def test_real_rows_reach_past_the_window_and_stay_inside_it(real):
    """The rows must test both regimes of a 16-token window: packed contexts far longer, WinoGrande's shorter."""
    lengths = [len(c) for c in real[0]]
    assert min(lengths) < fam.WINDOW and max(lengths) > 4 * fam.WINDOW
    assert any(len(c) + len(k) > MAX_LENGTH + 1 for c, k in zip(real[0], real[1]))  # left-truncated ones too


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_per_family(zoo, family):
    model = zoo.model(family)
    plan = attention_plan(model)
    implementation, packs, masks = EXPECTED[family]
    assert (model.config._attn_implementation, plan.pack, plan.masks) == (implementation, packs, masks)
    assert not plan.needs_check
    assert plan.prefix_sharing.startswith("packed (proven family" if packs else "unpacked (ALiBi")


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_scoring_equals_alone_and_float64_reference(zoo, real, family, record_property):
    model = zoo.model(family)
    n_tokens = np.array([len(k) for k in real[1]])
    ref = zoo.reference(family)
    packed_scorer = Scorer(model, MAX_LENGTH)
    packed = score(packed_scorer, real)
    alone = score(Scorer(model, MAX_LENGTH, share_prefixes=False), real)
    packs = EXPECTED[family][1]
    assert (packed_scorer.packed_rows > 0) == packs
    record_property("prefix_sharing", packed_scorer.plan.prefix_sharing)
    record_property("max_abs_packed_vs_alone", float(np.abs(packed - alone).max()))
    record_property("max_abs_packed_vs_f64", float(np.abs(packed - ref).max()))
    assert within(np.abs(packed - alone), n_tokens, alone)
    assert within(np.abs(packed - ref), n_tokens, ref)
    assert within(np.abs(alone - ref), n_tokens, ref)


@pytest.mark.parametrize("family", [f for f in FAMILIES if EXPECTED[f][1]])
def test_the_other_maskable_implementation_packs_exactly_too(zoo, real, family):
    """Packing is proven under sdpa and eager alike (Gemma-2 has eager only): a user's choice of either is safe."""
    other = EAGER if EXPECTED[family][0] == SDPA else None
    if other is None:
        with pytest.raises(ValueError):
            transformers.AutoModelForCausalLM.from_pretrained(zoo.path(family), attn_implementation=SDPA)
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(zoo.path(family), attn_implementation=other,
                                                              dtype=torch.float32).eval()
    scorer = Scorer(model, MAX_LENGTH)
    packed = score(scorer, real)
    assert scorer.plan.implementation == other and scorer.packed_rows > 0
    assert within(np.abs(packed - zoo.reference(family)), np.array([len(k) for k in real[1]]), zoo.reference(family))


def wrong_layouts(plan: AttentionPlan) -> dict[str, tuple]:
    """raylm's packing before per-family plans (no window in the mask), the window off by one either way, and for
    per-layer-dict families one tensor where a dict is needed (windowed or not)."""
    out = {"no window": tuple((k, None) for k, _ in plan.masks)}
    for label, shift in (("window+1", 1), ("window-1", -1)):
        out[label] = tuple((k, None if w is None else w + shift) for k, w in plan.masks)
    if ONE_TENSOR not in dict(plan.masks):
        out["one windowed tensor"] = ((ONE_TENSOR, fam.WINDOW),)
        out["one full tensor"] = PLAIN
    return out


@pytest.mark.parametrize("family", WINDOWED)
def test_negative_controls_a_wrong_window_is_caught(zoo, real, family, record_property):
    """The matrix cannot pass vacuously: the same comparison fails for every wrong layout of a windowed family."""
    model = zoo.model(family)
    plan = attention_plan(model)
    alone = score(Scorer(model, MAX_LENGTH, share_prefixes=False), real)
    for label, masks in wrong_layouts(plan).items():
        wrong = score(Scorer(model, MAX_LENGTH, plan=replace(plan, masks=masks)), real)
        record_property(f"max_abs_{label}", float(np.abs(wrong - alone).max()))
        assert np.abs(wrong - alone).max() > WRONG, label


@pytest.mark.parametrize("family", WINDOWED)
def test_at_bfloat16_the_startup_check_passes_the_right_layout_and_fails_every_wrong_one(zoo, real, family,
                                                                                       record_property):
    """bfloat16's noise is far above float32's, so the start-up check's bfloat16 tolerance is looser: loose enough
    for the right layout, still tight enough that each wrong one is refused (its margin is in startup_check.py)."""
    model = copy.deepcopy(zoo.model(family)).to(torch.bfloat16)
    plan = replace(attention_plan(model), needs_check=True)
    first = (real[0][:8], real[1][:8])
    right = packing_check(model, MAX_LENGTH, plan, first)
    assert right.agrees, right.verdict()
    for label, masks in wrong_layouts(plan).items():
        wrong = packing_check(model, MAX_LENGTH, replace(plan, masks=masks), first)
        record_property(f"max_abs_{label}", float(wrong.max_abs))
        assert not wrong.agrees, f"{label}: {wrong.verdict()}"


def test_at_bfloat16_a_trained_model_passes_the_startup_check(real):
    """stories260K (real logits, up to 21) passes the check it would get if its class were unproven."""
    model = load_model(ModelSpec(str(STORIES), dtype="bfloat16", device="cpu"))
    result = packing_check(model, MAX_LENGTH, replace(attention_plan(model), needs_check=True),
                           (real[0][:8], real[1][:8]))
    assert result.agrees and result.packed_rows > 0, result.verdict()


@pytest.mark.parametrize("family", ALIBI)
def test_negative_controls_packing_an_alibi_family_is_wrong(zoo, real, family):
    """Why ALiBi families are unpacked: forced packing raises or scores garbage, and the start-up check says so."""
    model = zoo.model(family)
    forced = replace(attention_plan(model), needs_check=True)
    result = packing_check(model, MAX_LENGTH, forced, (real[0][:8], real[1][:8]))
    assert not result.agrees and (result.error is not None or result.max_abs > WRONG)
    assert checked_plan(model, MAX_LENGTH, forced, (real[0][:8], real[1][:8])).pack is False


@pytest.mark.parametrize("family", FAMILIES)
def test_startup_check_verdict_per_family(zoo, real, family, record_property):
    """The start-up check run on each family's own candidate layout agrees exactly where the rule packs."""
    model = zoo.model(family)
    candidate = replace(attention_plan(model), needs_check=True)
    result = packing_check(model, MAX_LENGTH, candidate, (real[0][:8], real[1][:8]))
    record_property("startup_check", result.verdict())
    assert result.agrees == EXPECTED[family][1], result.verdict()
    assert result.packed_rows > 0 or result.error is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_scorer_matches_float64_reference(zoo, real, family, record_property):
    p, q = zoo.model(family, 0), zoo.model(family, 1)
    p64, q64 = zoo.model64(family, 0), zoo.model64(family, 1)
    contexts, continuations = real
    expected = np.array([reference_kl(p64, q64, c, k, MAX_LENGTH)[:3] for c, k in zip(contexts, continuations)])
    scores = KLScorer(p, q, MAX_LENGTH).score(contexts, continuations)
    got = np.stack([scores.kl, scores.nll_p, scores.nll_q], axis=1)
    diff = np.abs(got - expected)
    record_property("max_abs_kl_vs_f64", float(diff[:, 0].max()))
    assert within(diff.max(axis=1), np.array([len(k) for k in continuations]), np.abs(expected).max(axis=1))
    assert np.all(scores.kl > 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_corpus_scorer_matches_float64_reference(zoo, corpus_texts, family, record_property):
    """raylm ppl's per-document work (in-process: the code its actors run), short headings packed into a row next
    to full-length windows, against the HF strided-perplexity recipe in float64."""
    scorer_docs = DocPerplexity(zoo.spec(family), max_length=MAX_LENGTH, stride=STRIDE)
    out = scorer_docs(pa.table({"text": corpus_texts, "path": ["mem"] * len(corpus_texts)}))
    model64 = zoo.model64(family)
    # The actor's own tokenizer: AutoTokenizer picks its class by the model's config (Qwen2's is not Llama's).
    encoder = scorer_docs.documents.encoder
    expected = np.array([reference_strided_nll(model64, encoder.tokenizer, t, MAX_LENGTH, STRIDE)[0]
                         for t in corpus_texts])
    nll = np.array(out["nll"].to_pylist())
    record_property("max_abs_corpus_vs_f64", float(np.abs(nll - expected).max()))
    assert (scorer_docs.documents.scorer.packed_rows > 0) == EXPECTED[family][1]
    assert set(out[PREFIX_SHARING_COLUMN].to_pylist()) == {attention_plan(zoo.model(family)).prefix_sharing}
    assert within(np.abs(nll - expected), np.array(out["tokens"].to_pylist()), expected)


def test_negative_control_the_corpus_path_needs_the_window_in_every_row(zoo, encoder, corpus_texts):
    """A packed heading row gives its whole batch the 4D mask, full-length windows included: without the window in
    it (raylm's corpus path before per-family plans), Mistral's perplexity is wrong."""
    model = zoo.model("mistral")
    windows = [w for ids in encoder.encode_many(corpus_texts)
               for w in strided_windows(ids, encoder.prefix_token, MAX_LENGTH, STRIDE)]
    contexts, continuations = [w[0] for w in windows], [w[1] for w in windows]
    good = Scorer(model, MAX_LENGTH).score(contexts, continuations)[0]
    windowless = replace(attention_plan(model), masks=PLAIN)
    bad = Scorer(model, MAX_LENGTH, plan=windowless).score(contexts, continuations)[0]
    assert np.abs(bad - good).max() > WRONG


class _Bypass(torch.nn.Module):
    """Projects with the head's weight directly instead of calling the head module."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.lm_head

    def forward(self, **kwargs):
        hidden = self.inner.model(**kwargs).last_hidden_state
        return transformers.modeling_outputs.CausalLMOutput(logits=hidden @ self.inner.lm_head.weight.T)


class _Twice(_Bypass):
    """Calls its head twice (say, once for an auxiliary output)."""

    def forward(self, **kwargs):
        hidden = self.inner.model(**kwargs).last_hidden_state
        self.inner.lm_head(hidden)
        return transformers.modeling_outputs.CausalLMOutput(logits=self.inner.lm_head(hidden))


@pytest.mark.parametrize("wrapper", [_Bypass, _Twice])
@pytest.mark.parametrize("share", [True, False])
def test_head_guard_fails_loudly_on_a_model_that_does_not_call_its_head_once(zoo, real, wrapper, share):
    base = zoo.model("llama")
    scorer = Scorer(wrapper(base), MAX_LENGTH, share_prefixes=share, plan=attention_plan(base))
    with pytest.raises(HeadMisuse, match="cannot score it"):
        scorer.score(real[0][:8], real[1][:8])


def remote_class(base: type, name: str, body: dict | None = None) -> type:
    """A subclass of a transformers class defined outside transformers, standing in for trust_remote_code."""
    return type(name, (base,), {"__module__": "remote_code_stand_in", **(body or {})})


def _forward_without_positions(self, input_ids=None, position_ids=None, **kwargs):
    """What some remote code does: positions always counted from the row's first column."""
    return super(type(self), self).forward(input_ids=input_ids, **kwargs)


def remote_model(zoo: Zoo, family: str, ignore_positions: bool = False) -> torch.nn.Module:
    base = type(zoo.model(family))
    body = {"forward": _forward_without_positions} if ignore_positions else None
    cls = remote_class(base, f"Remote{'NoPositions' if ignore_positions else ''}{base.__name__}", body)
    return cls.from_pretrained(zoo.path(family), dtype=torch.float32).eval()


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma2", "llama"])
def test_startup_check_packs_an_unproven_model_only_once_it_agrees(zoo, real, family):
    model = remote_model(zoo, family)
    plan = attention_plan(model)
    assert plan.needs_check and not plan.pack and "start-up check not run" in plan.prefix_sharing
    unchecked = Scorer(model, MAX_LENGTH)
    score(unchecked, real)
    assert unchecked.packed_rows == 0  # unproven and unchecked: scored unpacked
    checked = checked_plan(model, MAX_LENGTH, plan, (real[0][:8], real[1][:8]))
    assert checked.pack and checked.prefix_sharing.startswith("packed (start-up check: max |Δ|")
    assert checked.masks == EXPECTED[family][2]
    scorer = Scorer(model, MAX_LENGTH, plan=checked)
    packed = score(scorer, real)
    assert scorer.packed_rows > 0
    assert within(np.abs(packed - zoo.reference(family)), np.array([len(k) for k in real[1]]), zoo.reference(family))


@pytest.mark.parametrize("family,wrong", [("mistral", PLAIN), ("gemma2", WINDOW), ("qwen2", PLAIN)])
def test_startup_check_refuses_a_wrong_layout(zoo, real, family, wrong):
    model = remote_model(zoo, family)
    plan = replace(attention_plan(model), masks=wrong)
    checked = checked_plan(model, MAX_LENGTH, plan, (real[0][:8], real[1][:8]))
    assert not checked.pack and checked.prefix_sharing.startswith("unpacked (start-up check: max |Δ|")


def test_eval_actor_falls_back_for_remote_code_that_ignores_position_ids(zoo, real, real_table, monkeypatch):
    """The actor checks once, on its first shard, records the verdict with every shard, and scores right."""
    import raylm.cluster.actors as actors

    model = remote_model(zoo, "llama", ignore_positions=True)
    monkeypatch.setattr(actors, "load_model", lambda spec, **_: model)
    actor = ScoringActor(zoo.spec("llama"), 1, None)
    first = actor.score("multiple_choice", real_table.slice(0, 40))  # HellaSwag's documents end at row 40
    second = actor.score("multiple_choice", real_table.slice(40))
    assert first.prefix_sharing == second.prefix_sharing
    assert first.prefix_sharing.startswith("unpacked (start-up check: max |Δ|")
    assert float(first.prefix_sharing.split("max |Δ| ")[1].split()[0]) > WRONG
    loglik = np.array(first.table["loglikelihood"].to_pylist() + second.table["loglikelihood"].to_pylist())
    ref = zoo.reference("llama")
    assert within(np.abs(loglik - ref), np.array([len(k) for k in real[1]]), ref)


def test_eval_actor_packs_remote_code_that_passes(zoo, real, real_table, monkeypatch):
    import raylm.cluster.actors as actors

    model = remote_model(zoo, "mistral")
    monkeypatch.setattr(actors, "load_model", lambda spec, **_: model)
    actor = ScoringActor(zoo.spec("mistral"), 1, None)
    scored = actor.score("multiple_choice", real_table)
    assert scored.prefix_sharing.startswith("packed (start-up check") and actor.resident.scorer.packed_rows > 0
    ref = zoo.reference("mistral")
    assert within(np.abs(np.array(scored.table["loglikelihood"].to_pylist()) - ref),
                  np.array([len(k) for k in real[1]]), ref)


def test_corpus_actor_falls_back_for_remote_code_that_ignores_position_ids(zoo, encoder, corpus_texts,
                                                                          monkeypatch):
    model = remote_model(zoo, "llama", ignore_positions=True)
    monkeypatch.setattr(doc_scoring, "load_model", lambda spec, **_: model)
    docs = DocPerplexity(zoo.spec("llama"), max_length=MAX_LENGTH, stride=STRIDE)
    out = docs(pa.table({"text": corpus_texts, "path": ["mem"] * len(corpus_texts)}))
    verdicts = set(out[PREFIX_SHARING_COLUMN].to_pylist())
    assert len(verdicts) == 1 and verdicts.pop().startswith("unpacked (start-up check")
    expected = [reference_strided_nll(zoo.model64("llama"), encoder.tokenizer, t, MAX_LENGTH, STRIDE)[0]
                for t in corpus_texts]
    assert out["nll"].to_pylist() == pytest.approx(expected, rel=1e-6)


def test_load_implementation_is_explicit_and_a_stated_one_is_left_alone(zoo):
    config = transformers.AutoConfig.from_pretrained(zoo.path("llama"))
    assert load_implementation(config, trust_remote_code=False) == SDPA
    for family in ("gemma2", "bloom", "mpt"):
        assert load_implementation(transformers.AutoConfig.from_pretrained(zoo.path(family)), False) == EAGER
    config._attn_implementation = EAGER
    assert load_implementation(config, False) is None
    config = transformers.AutoConfig.from_pretrained(zoo.path("llama"))
    config.auto_map = {"AutoModelForCausalLM": "modeling_x.X"}
    assert load_implementation(config, trust_remote_code=True) is None


def test_load_model_asks_for_the_implementation_load_implementation_chooses(zoo, monkeypatch):
    import raylm.models.loading as models

    monkeypatch.setattr(models, "load_implementation", lambda config, trust_remote_code: EAGER)
    assert load_model(zoo.spec("llama")).config._attn_implementation == EAGER


def test_config_json_attn_implementation_wins_and_the_plan_follows_it(zoo, real, tmp_path):
    """A config.json "attn_implementation" overrides from_pretrained's argument: the plan is made from what the
    loaded model has. Eager is proven; an implementation that takes no 4D mask is scored unpacked, correctly.
    (The public key: transformers 5.25 stopped reading the private "_attn_implementation" from config.json.)"""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register("raylm_test_attention", sdpa_attention_forward)
    AttentionMaskInterface.register("raylm_test_attention", sdpa_mask)
    n_tokens = np.array([len(k) for k in real[1]])
    ref = zoo.reference("llama")
    for implementation, packs in ((EAGER, True), ("raylm_test_attention", False)):
        path = tmp_path / implementation
        path.mkdir()
        for item in zoo.path("llama").iterdir():
            (path / item.name).write_bytes(item.read_bytes())
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "attn_implementation": implementation}))
        model = load_model(ModelSpec(str(path), dtype="float32", device="cpu"))
        scorer = Scorer(model, MAX_LENGTH)
        got = score(scorer, real)
        assert (scorer.plan.implementation, scorer.plan.pack, scorer.packed_rows > 0) == (implementation, packs, packs)
        assert within(np.abs(got - ref), n_tokens, ref)
    assert "takes no 4D mask" in scorer.plan.prefix_sharing


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_flash_and_flex_are_never_given_a_mask(zoo, implementation):
    model = zoo.model("llama")
    config = model.config
    saved = config._attn_implementation
    try:
        config._attn_implementation = implementation
        plan = attention_plan(model)
    finally:
        config._attn_implementation = saved
    assert not plan.pack and not plan.needs_check
    assert plan.prefix_sharing == f"unpacked (attention implementation {implementation!r} takes no 4D mask)"


def test_unknown_layer_types_and_bidirectional_attention_are_unpacked(zoo):
    model = remote_model(zoo, "qwen2")
    config = model.config
    config.layer_types = ["chunked_attention", "full_attention"]
    assert attention_plan(model).prefix_sharing.startswith("unpacked (layer types")
    config.layer_types = ["sliding_attention", "full_attention"]
    config.use_bidirectional_attention = True
    assert attention_plan(model).prefix_sharing == "unpacked (bidirectional attention)"


def test_the_driver_records_one_verdict_or_the_distinct_ones():
    from raylm.results.report import prefix_sharing

    packed = "packed (proven family: LlamaForCausalLM, sdpa)"
    assert prefix_sharing([packed, packed, None]) == packed
    fell_back = "unpacked (start-up check: max |Δ| 3.1 over 13 requests)"
    assert prefix_sharing([fell_back, "packed (start-up check: max |Δ| 2e-06 over 13 requests)"]) == [
        "packed (start-up check: max |Δ| 2e-06 over 13 requests)", fell_back]
    assert prefix_sharing([None]) is None


# MMLU 5-shot as lm-eval 0.4.13 built it (the golden's prompts): every question of a subject carries the same
# few-shot head (~700 tokens here), then its question, then four one-token choices: a tree three levels deep.
FEWSHOT_CONTEXT = 1024
FEWSHOT_QUESTIONS = 4
PACKED = [f for f in FAMILIES if EXPECTED[f][1]]


@pytest.fixture(scope="module")
def mmlu_fewshot(encoder):
    """(contexts, continuations) of the first questions of abstract_algebra, 5-shot, in stories260K's tokens."""
    samples = read_golden(FEW_SHOT)["samples"]["mmlu_abstract_algebra_local"][:FEWSHOT_QUESTIONS]
    pairs = [tuple(argument) for sample in samples for argument in sample["arguments"]]
    requests = Encoder(encoder.tokenizer, FEWSHOT_CONTEXT).encode_pairs(pairs)
    return [list(c) for c, _ in requests], [list(k) for _, k in requests]


@pytest.fixture(scope="module")
def long_zoo(tmp_path_factory):
    """Each family again with a position range wide enough for an untruncated 5-shot prompt."""
    paths: dict[str, Path] = {}

    def model(family: str) -> torch.nn.Module:
        if family not in paths:
            paths[family] = fam.build(family, tmp_path_factory.mktemp("long"), context=FEWSHOT_CONTEXT)
        return load_model(ModelSpec(str(paths[family]), dtype="float32", device="cpu"))

    return model


def tree_scores(model, requests, token_budget: int, shards: int = 2):
    """The requests scored as an actor scores its shards: cut inside the subject, each shard a tree whose rows are
    short enough (token_budget) that the few-shot head runs into the KV cache and the questions run over it."""
    contexts, continuations = requests
    cut = len(contexts) // shards // 4 * 4 + 2  # inside a question: its choices land in two shards
    scorer = Scorer(model, FEWSHOT_CONTEXT, token_budget=token_budget)
    parts = [scorer.score(contexts[a:b], continuations[a:b])[0] for a, b in ((0, cut), (cut, len(contexts)))]
    return np.concatenate(parts), scorer


@pytest.mark.parametrize("family", PACKED)
def test_tree_scoring_over_a_cached_fewshot_head_equals_the_float64_reference(long_zoo, mmlu_fewshot, family,
                                                                               record_property):
    contexts, continuations = mmlu_fewshot
    model = long_zoo(family)
    assert min(len(c) for c in contexts) > 40 * fam.WINDOW  # the head reaches far past every window
    got, scorer = tree_scores(model, mmlu_fewshot, token_budget=128)
    held = sum(len(c) + len(k) - 1 for c, k in zip(contexts, continuations))
    assert scorer.packed_rows > 0 and scorer.computed_tokens < held / 3  # the head ran once per shard
    model64 = float64_copy(model)
    ref = np.array([reference_score(model64, c, k, FEWSHOT_CONTEXT)[0] for c, k in zip(contexts, continuations)])
    record_property("max_abs_tree_vs_f64", float(np.abs(got - ref).max()))
    assert within(np.abs(got - ref), np.array([len(k) for k in continuations]), ref)


@pytest.mark.parametrize("family", [f for f in WINDOWED if f in PACKED])
def test_negative_control_a_window_that_ignores_the_cached_prefix_is_caught(long_zoo, mmlu_fewshot, family,
                                                                           monkeypatch):
    """The comparison above cannot pass vacuously: let the cached columns escape the sliding window and the
    windowed families score wrong."""
    from raylm.scoring import packing

    model = long_zoo(family)
    right, _ = tree_scores(model, mmlu_fewshot, token_budget=128)
    exact = packing.visibility

    def cache_outside_the_window(spans, positions, cached, window):
        visible = exact(spans, positions, cached, window)
        visible[..., :cached] = True
        return visible

    monkeypatch.setattr(packing, "visibility", cache_outside_the_window)
    wrong, _ = tree_scores(model, mmlu_fewshot, token_budget=128)
    assert np.abs(wrong - right).max() > WRONG
