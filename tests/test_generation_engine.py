"""The generation engine (raylm.scoring.generation) in-process: its greedy text equals a one-request, no-cache float64
reference (tests/reference_generation.py) whatever the slot count and request order, equals HF generate as lm-eval's
HFLM runs it, stops as HFLM stops, samples per request, and prefills a shared prompt prefix once."""

from __future__ import annotations

import copy
import random
import weakref
from types import SimpleNamespace

import pytest
import torch
import transformers as tf
from conftest import STORIES
from lm_eval.models.utils import configure_pad_token, postprocess_generated_text
from lm_eval.models.utils_hf import stop_sequences_criteria
from reference_generation import reference_generate
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import tiny_families as fam
from raylm.cluster.scoring_actor import ScoringActor
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.requests.order import common_prefix_length
from raylm.scoring import generation, generation_cache, memory
from raylm.scoring.batching import TokenBudget
from raylm.scoring.generation import GenerationRequest, Generator, eos_token_ids
from raylm.scoring.scorer import RequestDoesNotFit

EOS_TEXT = "</s>"  # stories260K's eos as text: HFLM appends it to every request's stop strings
# A few-shot-like head every real prompt shares, then questions whose first tokens differ, so the distinct prefixes
# are the head once plus each question.
HEAD = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to get it.\n\n")
QUESTIONS = ["Tom had a dog named Max.", "The sun was hot and bright.", "Sara went to the store with mom.",
             "A bird sang a song in the tree.", "Ben liked to play with cars.", "Mia saw a cat on the wall.",
             "Jack found a shiny rock.", "Every day, Anna drew a picture."]


@pytest.fixture(scope="module")
def stories():
    model = tf.AutoModelForCausalLM.from_pretrained(STORIES).eval()
    return model, tf.AutoTokenizer.from_pretrained(STORIES)


@pytest.fixture(scope="module")
def stories64(stories):
    return copy.deepcopy(stories[0]).double()


def real_requests(tokenizer, max_gen_toks: int = 24, until: tuple[str, ...] = ("\n\n", EOS_TEXT), **kw
                  ) -> list[GenerationRequest]:
    return [GenerationRequest(tuple(tokenizer.encode(HEAD + q)), until, max_gen_toks, **kw) for q in QUESTIONS]


def reference(model64, tokenizer, requests: list[GenerationRequest]) -> list[tuple[str, int]]:
    eos = set(eos_token_ids(model64, tokenizer))
    return [reference_generate(model64, tokenizer, list(r.context), list(r.until), r.max_gen_toks, eos)
            for r in requests]


def generate_in_order(model, tokenizer, requests, batch_size, order) -> list[tuple[str, int]]:
    """Generate `requests` submitted in `order`, answers given back in the original order."""
    out = Generator(model, tokenizer, batch_size).generate([requests[i] for i in order])
    answers: list = [None] * len(requests)
    for i, generated in zip(order, out):
        answers[i] = (generated.text, generated.tokens)
    return answers


# The families of tests/tiny_families.py whose attention the engine switches to the shared-prefix function.
SHARES_PREFIX = {"gpt2", "gpt_neox", "gptj", "llama", "olmo", "olmo2", "opt", "phi"}
ORDERS = {"given": lambda n: list(range(n)), "reversed": lambda n: list(range(n))[::-1],
          "shuffled": lambda n: random.Random(3).sample(range(n), n)}
# (slots, order) pairs: one slot (no batching at all), a few (sequences join as others stop), all the budget allows
LAYOUTS = [(1, "shuffled"), (2, "reversed"), (3, "given"), (None, "given"), (None, "shuffled")]


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "qwen2"])
def test_float64_random_contexts_equal_the_reference(stories, family):
    """Random token contexts on random models: RoPE, absolute positions (GPT-2), a 16-token sliding window reaching
    across the slots' stale columns (Mistral), per-layer-type masks (Qwen2). Half the contexts share a 40-token
    prefix, one is a prefix of another, and max_gen_toks differ, so sequences stop at different steps."""
    tokenizer = stories[1]
    torch.manual_seed(0)
    model64 = tf.AutoModelForCausalLM.from_config(fam.FAMILIES[family]()).double().eval()
    rng = random.Random(family)
    shared = [rng.randrange(3, fam.VOCAB) for _ in range(40)]
    contexts = [shared + [rng.randrange(3, fam.VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(5)]
    contexts += [[rng.randrange(3, fam.VOCAB) for _ in range(rng.randrange(1, 50))] for _ in range(3)]
    contexts.append(contexts[0][:45])
    requests = [GenerationRequest(tuple(c), (EOS_TEXT, "."), 4 + i % 3 * 5) for i, c in enumerate(contexts)]
    expected = reference(model64, tokenizer, requests)
    assert len({tokens for _, tokens in expected}) > 2  # sequences end at different steps
    for batch_size, order in LAYOUTS:
        got = generate_in_order(model64, tokenizer, requests, batch_size, ORDERS[order](len(requests)))
        assert got == expected, (batch_size, order)


def test_a_prefix_every_request_shares_is_attended_once_and_equals_the_reference(stories):
    """Where a whole call shares a prefix, the families whose attention can be switched keep it once, batch 1
    (raylm.scoring.shared_prefix_attention): no decode step's cache holds it, and the text equals the reference's on
    each of them (RoPE in full and in part, absolute and learned positions, GQA, QK-norm, parallel blocks). The rest
    (sliding windows, soft-capping, ALiBi, attention not routed through transformers' interface) keep the slots'
    copies, as the test above proves; the model's attention is back to its own after every call. The prefix's
    passes compute no logits."""
    tokenizer = stories[1]
    rng = random.Random(7)
    shared = [rng.randrange(3, fam.VOCAB) for _ in range(40)]
    contexts = [shared + [rng.randrange(3, fam.VOCAB) for _ in range(rng.randrange(1, 9))] for _ in range(4)]
    requests = [GenerationRequest(tuple(c), (EOS_TEXT, "."), 3 + i % 2 * 3) for i, c in enumerate(contexts)]
    taking = set()
    for family, config in sorted(fam.FAMILIES.items()):
        torch.manual_seed(0)
        model64 = tf.AutoModelForCausalLM.from_config(config()).double().eval()
        own = model64.config._attn_implementation
        if not Generator(model64, tokenizer).shares_prefix:
            continue
        taking.add(family)
        expected = reference(model64, tokenizer, requests)
        for batch_size in (None, 2):
            got, head_rows = [], []
            hook = model64.get_output_embeddings().register_forward_hook(
                lambda _m, _a, out: head_rows.append(out.shape[:-1].numel()))
            try:
                steps = decode_shapes(model64, lambda: got.extend(Generator(model64, tokenizer, batch_size).generate(
                    requests)))
            finally:
                hook.remove()
            assert [(g.text, g.tokens) for g in got] == expected, (family, batch_size)
            assert steps and max(width for _, width in steps) < len(shared), family
            # The prefix's own passes run the LM head on none of its positions: no pass on more than its rows.
            assert max(head_rows) <= len(requests), (family, head_rows)
        assert model64.config._attn_implementation == own, family
    assert taking == SHARES_PREFIX


def test_float64_real_prompts_sharing_a_head_equal_the_reference(stories, stories64):
    tokenizer = stories[1]
    requests = real_requests(tokenizer, max_gen_toks=16, until=("\n\n", EOS_TEXT, ","))[:6]
    expected = reference(stories64, tokenizer, requests)
    assert any(tokens < 16 for _, tokens in expected) and any(tokens == 16 for _, tokens in expected)
    for batch_size, order in LAYOUTS:
        got = generate_in_order(stories64, tokenizer, requests, batch_size, ORDERS[order](len(requests)))
        assert got == expected, (batch_size, order)
    # a token budget below the shared head: the head runs in pieces, prompts are prefilled a few rows at a time
    gen = Generator(stories64, tokenizer, 4, budget=TokenBudget(12))
    got = []
    shapes = forward_shapes(stories64, lambda: got.extend(gen.generate(requests)))
    assert [(g.text, g.tokens) for g in got] == expected
    longest_suffix = max(len(r.context) for r in requests) - min(
        common_prefix_length(requests[0].context, r.context) for r in requests)
    prompt_passes = [(rows, width) for rows, width, _, decode in shapes if not decode]
    assert all(rows * width <= 12 or (rows == 1 and width <= longest_suffix) for rows, width in prompt_passes)
    assert sum(rows == 1 and width == 12 for rows, width in prompt_passes) >= 5  # the head, in pieces


def hflm_generate(model, tokenizer, requests: list[GenerationRequest], batch_size: int) -> list[str]:
    """HFLM.generate_until's model call on the same tokens: left-padded batches through HF generate with lm-eval's
    stop_sequences_criteria, then decoded and cut."""
    pad = configure_pad_token(copy.deepcopy(tokenizer)).pad_token_id  # as HFLM sets it (stories260K: <unk>)
    texts = []
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        width = max(len(r.context) for r in batch)
        ids = torch.tensor([[pad] * (width - len(r.context)) + list(r.context) for r in batch])
        mask = torch.tensor([[0] * (width - len(r.context)) + [1] * len(r.context) for r in batch])
        until = list(batch[0].until)
        out = model.generate(input_ids=ids, attention_mask=mask, max_length=width + batch[0].max_gen_toks,
                             stopping_criteria=stop_sequences_criteria(tokenizer, until, width, len(batch)),
                             pad_token_id=pad, use_cache=True, do_sample=False)
        texts += [postprocess_generated_text(tokenizer.decode(row[width:].tolist(), skip_special_tokens=True), until,
                                             None) for row in out]
    return texts


def test_float32_equals_hf_generate_as_hflm_runs_it(stories, record_property):
    model, tokenizer = stories
    requests = real_requests(tokenizer, max_gen_toks=32, until=("\n\n", ",", EOS_TEXT)) + [
        GenerationRequest(tuple(tokenizer.encode(q)), ("\n\n", EOS_TEXT), 32) for q in QUESTIONS[:4]]
    ours = [g.text for g in Generator(model, tokenizer, 4).generate(requests)]
    theirs = hflm_generate(model, tokenizer, requests, 4)
    flips = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    record_property("near_tie_flips", f"{len(flips)} of {len(requests)}")
    assert not flips, [(ours[i], theirs[i]) for i in flips]


def test_a_stop_string_spanning_several_tokens_stops_at_its_last_token(stories):
    model, tokenizer = stories
    context = tuple(tokenizer.encode(HEAD + QUESTIONS[0]))
    free = Generator(model, tokenizer).generate([GenerationRequest(context, (), 30)])[0]
    assert free.tokens == 30  # no eos within 30: the free run is the whole greedy continuation
    new = _greedy_tokens(model, context, 30)
    # a stop made of new tokens 6..9, ending inside token 9's text
    stop = tokenizer.decode(new[:10])[len(tokenizer.decode(new[:6])):-1]
    assert len(tokenizer.encode(stop, add_special_tokens=False)) >= 3 and stop not in tokenizer.decode(new[:9])
    got = Generator(model, tokenizer).generate([GenerationRequest(context, ("never", stop), 30)])[0]
    assert got.tokens == 10
    assert got.text == free.text.split(stop)[0]


def _greedy_tokens(model, context, n: int) -> list[int]:
    ids = list(context)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(context):]


def test_eos_stops_a_sequence_and_is_not_in_its_text(stories):
    model, tokenizer = stories
    context = tuple(tokenizer.encode(HEAD + QUESTIONS[1]))
    new = _greedy_tokens(model, context, 12)
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [2, new[4]]  # the fifth new token is an eos id now
    got = Generator(model, tokenizer, 2).generate([GenerationRequest(context, (), 12)] * 2)
    text = tokenizer.decode(new[:5], skip_special_tokens=True)
    assert [(g.text, g.tokens) for g in got] == [(text, 5)] * 2


def test_a_special_tokens_text_is_a_stop_string_as_hflm_decodes_it(stories64):
    """HFLM's stop criterion decodes with special tokens, so a stop string that is a special token's text (a chat
    model's end-of-turn marker that is not among its eos ids) stops generation; the answer, decoded without special
    tokens, then does not show it."""
    tokenizer = tf.AutoTokenizer.from_pretrained(STORIES)
    context = tuple(tokenizer.encode(HEAD + QUESTIONS[3]))
    model64 = copy.deepcopy(stories64)
    new = _greedy_tokens(model64, context, 12)
    with torch.no_grad():  # </s> (id 2) now outscores the fourth new token wherever that one wins
        model64.get_output_embeddings().weight[2] = 1.01 * model64.get_output_embeddings().weight[new[3]]
    model64.generation_config.eos_token_id = -1  # no eos id: only the stop string can stop it
    request = GenerationRequest(context, (EOS_TEXT,), 12)
    expected = reference(model64, tokenizer, [request])
    assert expected[0][1] < 12 and EOS_TEXT not in expected[0][0]
    got = Generator(model64, tokenizer).generate([request])[0]
    assert [(got.text, got.tokens)] == expected


def test_max_gen_toks_and_an_empty_stop_list(stories):
    model, tokenizer = stories
    requests = [GenerationRequest(tuple(tokenizer.encode(HEAD + q)), (), n) for q, n in zip(QUESTIONS, (0, 1, 7, 30))]
    got = Generator(model, tokenizer, 2).generate(requests)
    assert [g.tokens for g in got] == [0, 1, 7, 30]
    assert got[0].text == ""
    for g, r in zip(got[1:], requests[1:]):
        assert g.text == tokenizer.decode(_greedy_tokens(model, r.context, r.max_gen_toks), skip_special_tokens=True)


def test_same_seed_same_sample_whatever_the_slots_and_order(stories, stories64):
    tokenizer = stories[1]
    requests = [GenerationRequest(r.context, r.until, 16, do_sample=True, temperature=0.9, top_k=40, top_p=0.95,
                                  seed=i) for i, r in enumerate(real_requests(tokenizer))]
    first = generate_in_order(stories64, tokenizer, requests, 1, ORDERS["given"](len(requests)))
    assert len({text for text, _ in first}) == len(requests)
    for batch_size, order in [(2, "reversed"), (None, "shuffled")]:
        got = generate_in_order(stories64, tokenizer, requests, batch_size, ORDERS[order](len(requests)))
        assert got == first, (batch_size, order)


def test_different_seeds_differ_and_top_k_1_is_greedy(stories):
    model, tokenizer = stories
    context = tuple(tokenizer.encode(HEAD + QUESTIONS[2]))
    samples = Generator(model, tokenizer).generate(
        [GenerationRequest(context, (), 16, do_sample=True, temperature=1.5, seed=s) for s in range(4)])
    assert len({g.text for g in samples}) > 1
    greedy = Generator(model, tokenizer).generate([GenerationRequest(context, (), 16)])[0]
    top1 = Generator(model, tokenizer).generate(
        [GenerationRequest(context, (), 16, do_sample=True, temperature=1.5, top_k=1, seed=7)])[0]
    assert top1 == greedy


def test_a_shared_head_is_prefilled_once_per_call(stories):
    """Kept once for the whole call (every request shares the head), the head runs once and each request's rest
    whole. On the path (a model that keeps copies in the slots): admitted one at a time, every distinct prefix of the
    contexts runs once; admitted in waves, the prefix a wave shares runs once and a token or two that only part of a
    wave shares may run per request: never the head."""
    model, tokenizer = stories
    requests = real_requests(tokenizer, max_gen_toks=2)
    contexts = [r.context for r in requests]
    in_requests = sum(len(c) for c in contexts)
    distinct = len({c[:n] for c in contexts for n in range(1, len(c) + 1)})  # the contexts' trie nodes
    shared = min(common_prefix_length(contexts[0], c) for c in contexts)
    head_once = shared + sum(len(c) - shared for c in contexts)
    assert shared >= len(tokenizer.encode(HEAD)) - 1 and head_once < in_requests / 3
    for shares_prefix, batch_size in ((True, 1), (True, None), (False, 1), (False, 3), (False, None)):
        gen = Generator(model, tokenizer, batch_size)
        assert gen.shares_prefix  # a Llama
        gen.shares_prefix = shares_prefix
        gen.generate(requests)
        assert gen.tokens_in_requests == in_requests
        assert gen.generated_tokens == 2 * len(requests)
        if shares_prefix:
            assert gen.prefilled_tokens == head_once, batch_size
        else:
            assert (gen.prefilled_tokens == distinct) if batch_size == 1 else (
                distinct <= gen.prefilled_tokens <= head_once), (batch_size, gen.prefilled_tokens)
        first = gen.prefilled_tokens
        gen.generate(requests)  # counters add up over calls; a call does not keep another's prefix
        assert (gen.prefilled_tokens, gen.tokens_in_requests) == (2 * first, 2 * in_requests)


def forward_shapes(model, run) -> list[tuple[int, int, int, bool]]:
    """(rows, new tokens per row, cached tokens, whether a decode step: it carries the slots' 2D mask) of every
    forward pass `run()` makes."""
    shapes = []

    def record(_module, _args, kwargs):
        rows, width = kwargs["input_ids"].shape
        shapes.append((rows, width, kwargs["cache"].get_seq_length(), kwargs.get("attention_mask") is not None))

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        run()
    finally:
        hook.remove()
    return shapes


def decode_shapes(model, run) -> list[tuple[int, int]]:
    """(rows, cache width) of every decode step `run()` makes."""
    return [(rows, cached) for rows, _, cached, decode in forward_shapes(model, run) if decode]


def test_a_stopped_sequence_frees_its_slot(stories):
    """Two slots, three requests; the first stops after 2 tokens: continuous batching runs the other two side by
    side, in 20 decode steps, where batches padded out to their longest member would take 38."""
    model, tokenizer = stories
    contexts = sorted(tuple(tokenizer.encode(HEAD + q)) for q in QUESTIONS[:3])
    requests = [GenerationRequest(c, (), n) for c, n in zip(contexts, (2, 20, 20))]
    got = []
    steps = decode_shapes(model, lambda: got.extend(Generator(model, tokenizer, 2).generate(requests)))
    assert [g.tokens for g in got] == [2, 20, 20]
    assert len(steps) == 20 and {rows for rows, _ in steps} == {2, 1}


def test_slots_are_sized_from_the_kv_budget_and_the_cache_stays_as_wide_as_its_longest_sequence(stories):
    """The slots hold what follows the head every request shares (kept once): the budget is spent on that."""
    model, tokenizer = stories
    requests = real_requests(tokenizer, max_gen_toks=12, until=(",", EOS_TEXT))
    shared = min(common_prefix_length(requests[0].context, r.context) for r in requests)
    longest = max(len(r.context) - shared + r.max_gen_toks for r in requests)
    widest = max(len(r.context) for r in requests) - shared
    per_token = memory.kv_bytes_per_token(model.config, model.dtype)
    gen = Generator(model, tokenizer, kv_budget=memory.generation_tokens(3, shared, longest, widest) * per_token)
    assert gen.slots_for(requests, shared) == 3 and gen.slots_for(requests) == 1
    got = []
    steps = decode_shapes(model, lambda: got.extend(gen.generate(requests)))
    assert max(rows for rows, _ in steps) == 3
    assert got == Generator(model, tokenizer, 3).generate(requests)
    # the cache holds each live sequence's keys once, right-aligned: never wider than the longest of them by more
    # than the columns Slots.trim lets pile up before it cuts them (under an eighth of the width)
    fraction = generation_cache.TRIM_FRACTION
    assert max(width for _, width in steps) * (fraction - 1) < longest * fraction


def test_a_request_past_the_models_positions_is_refused(stories):
    model, tokenizer = stories
    with pytest.raises(RequestDoesNotFit, match="exceed the model's 512 positions"):
        Generator(model, tokenizer).generate([GenerationRequest((1,) * 500, (), 20)])
    with pytest.raises(RequestDoesNotFit, match="no context tokens"):
        Generator(model, tokenizer).generate([GenerationRequest((), (), 20)])


class LiveKeysAndValues(TorchDispatchMode):
    """Every tensor shaped as keys or values (rows, kv heads, columns, head dim) that any op makes while it is on;
    live_bytes() sums the storages of those still alive, each once: caches, the buffers behind their views, a
    prefill's copies of a prefix."""

    def __init__(self, config):
        super().__init__()
        self.shape = (config.num_key_value_heads, config.head_dim)
        self.made: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [weakref.ref(t) for t in tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.dim() == 4 and (t.shape[1], t.shape[3]) == self.shape]
        return out

    def live_bytes(self) -> int:
        self.made = [ref for ref in self.made if ref() is not None]
        storages = {}
        for ref in self.made:
            tensor = ref()
            if tensor is not None:
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return sum(storages.values())


class PeakKeysAndValues(LiveKeysAndValues):
    """LiveKeysAndValues that also keeps the most bytes live just after any op: the moment a new copy of a cache
    exists beside whatever of the old one is still referenced."""

    def __init__(self, config):
        super().__init__(config)
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.peak = max(self.peak, self.live_bytes())
        return out


KV_LAYERS, KV_HEADS, KV_DIM = 8, 2, 4


def kv_rows(rows: int, columns: int) -> tf.DynamicCache:
    """A prefill cache of `rows` rows, `columns` columns, KV_LAYERS layers."""
    return tf.DynamicCache(ddp_cache_data=[
        (torch.randn(rows, KV_HEADS, columns, KV_DIM), torch.randn(rows, KV_HEADS, columns, KV_DIM))
        for _ in range(KV_LAYERS)])


def slots_bytes(slots: generation_cache.Slots) -> int:
    """The storage the slots' keys and values are in (the buffers behind their views), each once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for layer in slots.cache.layers for t in (layer.keys, layer.values)}
    return sum(storages.values())


def test_the_slots_release_each_layers_old_keys_as_its_new_ones_are_made():
    """Widening the slots, appending rows to them (to none, or to some) and keeping some of their rows each make a
    new copy of every layer's keys and values; the old ones go as each layer's new ones are made, so what is live
    at any moment is the larger of the cache before and after plus about one layer, never the two caches at once
    (which, with the KV budget at half the free memory, would be all of it)."""
    live = PeakKeysAndValues(SimpleNamespace(num_key_value_heads=KV_HEADS, head_dim=KV_DIM))
    slots = generation_cache.Slots()
    first, wider, more = kv_rows(4, 40), kv_rows(1, 100), kv_rows(2, 120)
    peaks = {}

    def measure(name: str, op) -> None:
        before = slots_bytes(slots) if slots.cache is not None else 0
        live.peak = 0
        op()
        largest = max(before, slots_bytes(slots))
        peaks[name] = (live.peak - largest) / (largest / KV_LAYERS)  # beyond the larger cache, in layers

    def decode_step() -> None:
        for l in range(KV_LAYERS):
            slots.cache.update(torch.randn(len(slots), KV_HEADS, 1, KV_DIM),
                               torch.randn(len(slots), KV_HEADS, 1, KV_DIM), l)

    with live:
        measure("append to none", lambda: slots.add(first, range(4), [40, 30, 20, 10]))
        decode_step()
        measure("widen", lambda: slots.add(wider, [0], [100], free=[2]))
        decode_step()
        measure("append", lambda: slots.add(more, [0, 1], [120, 60]))
        decode_step()
        measure("keep", lambda: slots.keep([1, 4]))
    assert all(layers <= 1 for layers in peaks.values()), peaks


@pytest.fixture(scope="module")
def long_prefix(stories) -> tuple[list[GenerationRequest], list]:
    """Eight questions after a ~330-token head they all share (the head is most of every prompt), and their answers
    from one slot."""
    model, tokenizer = stories
    requests = [GenerationRequest(tuple(tokenizer.encode(HEAD * 5 + q)), (), 8) for q in QUESTIONS]
    return requests, Generator(model, tokenizer, 1).generate(requests)


def kv_budget_for(model, requests: list[GenerationRequest], slots: int, held_once: bool = True) -> int:
    """The KV bytes a call of `requests` holds at most with `slots` slots, the prefix they share held once, or not."""
    shared = min(common_prefix_length(requests[0].context, r.context) for r in requests) if held_once else 0
    longest = max(len(r.context) - shared + r.max_gen_toks for r in requests)
    widest = max(len(r.context) for r in requests) - shared
    return memory.generation_tokens(slots, shared or widest, longest, widest) * memory.kv_bytes_per_token(model.config,
                                                                                                 model.dtype)


@pytest.mark.parametrize("held_once", [True, False])
def test_the_keys_and_values_live_after_every_forward_stay_within_the_kv_budget(stories, long_prefix, held_once):
    """With a long prefix every request shares, what is live after each forward pass (the prefix once, the slots'
    buffers, a prefill's rows) stays within the budget the slots were sized for, while four slots decode; and the
    text is the same as one slot's. So too where the model's attention cannot hold the prefix once: then the prefill
    rows and the slots hold copies of it, and the budget buys fewer slots. A prefill pass holds as many rows as the
    token budget holds whole contexts: each row's suffix attends to all of its context."""
    model, tokenizer = stories
    requests, expected = long_prefix
    budget = kv_budget_for(model, requests, 4, held_once)
    gen = Generator(model, tokenizer, budget=TokenBudget(2 * max(len(r.context) for r in requests)),
                    kv_budget=budget)
    gen.shares_prefix = held_once
    live = LiveKeysAndValues(model.config)
    got: list = []
    after: list[int] = []
    hook = model.register_forward_hook(lambda *_: after.append(live.live_bytes()))
    try:
        with live:
            shapes = forward_shapes(model, lambda: got.extend(gen.generate(requests)))
    finally:
        hook.remove()
    assert max(rows for rows, _, _, decode in shapes if decode) == 4
    assert max(rows for rows, _, _, decode in shapes if not decode) == 2
    assert max(after) <= budget, max(after) / budget
    assert got == expected


@pytest.mark.parametrize("fits_after", [True, False])
def test_out_of_memory_halves_the_budget_and_the_answers_stay(stories, long_prefix, fits_after):
    """Eight slots' prefill runs out of GPU memory (once, or always): the scorer's halving loop halves the token
    budget, and with it the KV budget, so the call starts again in two slots with what is not answered yet, and
    every answer is what one slot gives; where even one slot does not fit, the error is raised and the model's
    attention is its own again."""
    model, tokenizer = stories
    requests, expected = long_prefix
    budget = TokenBudget(1024)
    gen = Generator(model, tokenizer, budget=budget, kv_budget=kv_budget_for(model, requests, 8))
    raised: list[int] = []
    rows_run: list[int] = []

    def out_of_memory(_module, _args, kwargs):
        rows = kwargs["input_ids"].shape[0]
        if rows > 2 or not fits_after:
            raised.append(rows)
            raise torch.cuda.OutOfMemoryError("fake: out of memory")
        rows_run.append(rows)

    own = model.config._attn_implementation
    hook = model.register_forward_pre_hook(out_of_memory, with_kwargs=True)
    try:
        if fits_after:
            assert gen.generate(requests) == expected
            assert raised == [8] and budget.tokens == 512 and max(rows_run) == 2
        else:
            with pytest.raises(torch.cuda.OutOfMemoryError):
                gen.generate(requests)
    finally:
        hook.remove()
    assert model.config._attn_implementation == own


def test_a_model_that_counts_positions_from_the_cache_width_is_refused(stories):
    """BartForCausalLM (and its Marian, Pegasus, Blenderbot kin) takes no position ids and is not ALiBi: batched rows
    of other lengths would decode at the slots' width, so the engine refuses it, naming the class."""
    config = tf.BartConfig(vocab_size=fam.VOCAB, d_model=16, decoder_layers=1, decoder_attention_heads=2,
                           decoder_ffn_dim=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32)
    with pytest.raises(RaylmError, match="^BartForCausalLM takes no position_ids and is not an ALiBi model"):
        Generator(tf.BartForCausalLM(config), stories[1])


def test_an_actors_scoring_and_generation_share_one_token_budget(tiny_llama):
    """Out of memory in either halves the budget both run under."""
    actor = ScoringActor(ModelSpec(str(tiny_llama), "float32", "cpu"), 1, None)
    actor.ready()
    assert actor.resident.generation_engine().budget is actor.resident.scorer.budget


def test_an_actors_generator_budgets_the_share_of_the_gpu_it_was_started_with(tiny_llama, monkeypatch):
    """The share of its GPU an actor is started with (raylm.cluster.runtime.ActorRecipe) reaches the KV budget."""
    shares = []
    monkeypatch.setattr(generation, "kv_bytes", lambda device, gpu_share=1.0: shares.append(gpu_share) or 2**20)
    actor = ScoringActor(ModelSpec(str(tiny_llama), "float32", "cpu"), 1, None, 0.5)
    actor.ready()
    assert actor.resident.generation_engine().kv_budget == 2**20 and shares == [0.5]
