"""The generation engine: lm-eval generate_until requests answered in plain torch, as lm-eval's HFLM answers them.

HFLM (lm-eval 0.4.13) runs HF `model.generate` on left-padded batches: every question of gsm8k_cot prefills the same
eight exemplars again, and a batch runs until its longest member stops. This engine produces the same greedy text
with less work, and is built so that none of its shortcuts can change a generation:

* Requests are admitted in sorted token order, so requests that share a prompt prefix (few-shot exemplars, a
  system prompt, a chat template's head) come together; the shared prefix is run once into a batch-1 KV cache (the
  path, raylm.scoring.generation_cache) and each request prefills only what follows it, over that cache.
* Where every request of the call shares a prefix (SHARED_PREFIX_MIN_TOKENS or more) and the model's attention
  allows it (raylm.scoring.shared_prefix_attention), that prefix stays batch 1 for the whole call: the slots hold
  only what follows it, and every forward pass, prefill and decoding step, attends to it once for all rows instead
  of to a copy in each row.
* What the keys and values of a call hold at once (the prefix, the slots, a prefill's rows) stays within a budget
  measured from the device (raylm.scoring.memory), which sizes the slots; the width of a forward pass stays within
  the token budget the scorer also uses. On out of GPU memory both halve, by the scorer's own halving loop, and the
  requests not yet answered start again: a request's text depends on nothing the halving changes.
* Decoding is continuously batched: a fixed number of slots, each holding one sequence; a sequence that stops (an
  eos id, a stop string, max_gen_toks) gives its slot to the next request at once. Sequences of different lengths
  share one cache right-aligned, as HF generate's left padding, with a 2D mask and true positions, so each sees
  exactly its own tokens.
* Stop strings are watched as tokens arrive, on a decoded window (raylm.scoring.generation_text), and the answer is
  the whole decode cut as HFLM cuts it, so when the watch fires changes the token count, never the text.
* A sampled request draws from its own torch.Generator seeded by the request, so its text does not depend on which
  requests share its batch, slot or actor.

Every choice above leaves each sequence's computation what it would be alone, up to floating-point rounding of the
batch shape: at float64 the engine equals a one-request, no-cache reference exactly (tests/reference_generation.py).

Where a vLLM engine would plug in: `Generator` is the seam. The actor builds one from (model, tokenizer, batch_size),
calls only `generate(requests) -> list[Generated]` and reads the three counters, so an engine holding a vLLM `LLM`
can stand beside this one, chosen when the actor loads the model on a GPU. vLLM does prefix caching and continuous
batching itself; such an engine would map each request to SamplingParams(max_tokens=max_gen_toks, stop=until,
skip_special_tokens=False so a special token's text stops as HFLM's criterion sees it, temperature 0 or the request's
sampling with seed=seed) and build each answer with generation_text.final_text from the returned token ids, so the
cut stays HFLM's. None is written here: nothing on this machine could run it, and an engine nothing runs is not
shipped.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import (LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from raylm.errors import RaylmError
from raylm.models.context import config_max_length
from raylm.models.devices import input_device
from raylm.requests.order import common_prefix_length
from raylm.scoring.batching import TokenBudget, halving_on_oom
from raylm.scoring.generation_cache import PrefixPath, Slots
from raylm.scoring.generation_text import StopWatch, final_text
from raylm.scoring.memory import kv_bytes, kv_bytes_per_token, slots_fitting
from raylm.scoring.scorer import (GPU_START_TOKEN_BUDGET, RequestDoesNotFit, cpu_token_budget,
                                  forward, gather_head_inputs, logits_budget_bytes, max_predicted_positions)
from raylm.scoring.shared_prefix_attention import attending_to, prefix_attention, takes_shared_prefix

# A prefix every request of a call shares is kept once (batch 1) for the whole call from this many tokens: below it
# the rows' copies cost little, and admissions that share more than the call does still share it on the path.
SHARED_PREFIX_MIN_TOKENS = 32


@dataclass(frozen=True)
class GenerationRequest:
    context: tuple[int, ...]  # prompt token ids as the model sees them (encoded, left-truncated), never empty
    until: tuple[str, ...]  # stop strings, the decoded eos text included
    max_gen_toks: int  # at most this many new tokens
    do_sample: bool = False  # False: greedy (argmax, ties -> lowest id as torch.argmax)
    temperature: float = 1.0  # used only when do_sample; HF's warper order: temperature, top_k, top_p
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int = 0  # sampling draws from torch.Generator().manual_seed(seed), one per request


@dataclass(frozen=True)
class Generated:
    text: str  # decode(new tokens, skip_special_tokens=True), cut before each non-empty stop string in turn
    tokens: int  # new tokens generated (stopping at eos, a stop string or max_gen_toks)


@dataclass
class _Sequence:
    """One request being decoded: its stop watch holds its new tokens."""

    request: int
    watch: StopWatch
    warpers: list[LogitsProcessor] = field(default_factory=list)  # HF's, in HF's order
    generator: torch.Generator | None = None


class Generator:
    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int | None = None,
                 budget: TokenBudget | None = None, kv_budget: int | None = None, gpu_share: float = 1.0) -> None:
        """batch_size: at most this many slots (sequences decoded together); None: as many as the KV budget holds.
        `budget`: the token budget of one forward pass, shared with the scorer of the same model where given (an
        out-of-memory error in either halves it for both); `kv_budget`: bytes of keys and values at the full token
        budget, measured from the device where not given (raylm.scoring.memory), of which this process was given
        `gpu_share` (an actor's fraction of a GPU; 1 for a device of its own)."""
        # HF generate passes position ids to the models that take them; the others (ALiBi) read positions from the
        # 2D mask. A model that does neither counts positions from the cache's width, which is the slots' width, not
        # each row's length.
        self.takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        if not (self.takes_positions or _alibi(model)):
            raise RaylmError(f"{type(model).__name__} takes no position_ids and is not an ALiBi model: it would "
                             "decode batched rows at the cache's width instead of their own positions, so raylm "
                             "does not generate with it")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = input_device(model)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.max_positions = config_max_length(model.config)
        self.prefilled_tokens = 0  # tokens run through the model as prompt, a shared prefix once per call
        self.generated_tokens = 0
        self.tokens_in_requests = 0  # sum of len(context): what prefilling every request whole would cost
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (LM head) to generate with")
        self.head = head
        self.shares_prefix = self.takes_positions and takes_shared_prefix(model)
        self.budget = budget or TokenBudget(GPU_START_TOKEN_BUDGET if self.device.type == "cuda"
                                            else cpu_token_budget(model.config))
        self.kv_budget = kv_bytes(self.device, gpu_share) if kv_budget is None else kv_budget
        self.kv_per_token = kv_bytes_per_token(model.config, getattr(model, "dtype", torch.float32))
        self._max_rows = max_predicted_positions(model, head, logits_budget_bytes(self.device.type))

    @property
    def token_budget(self) -> int:
        """Tokens one forward pass may run."""
        return self.budget.tokens

    @property
    def kv_tokens(self) -> int:
        """Cached tokens (rows times columns) a call may hold: the KV budget, cut as the token budget has been."""
        return self.kv_budget * self.budget.tokens // self.budget.ceiling // self.kv_per_token

    def slots_for(self, requests: Sequence[GenerationRequest], shared: int = 0) -> int:
        """As many slots as fit kv_tokens (raylm.scoring.memory.generation_tokens: a `shared` prefix held once, each
        slot's longest sequence, and a prefill of as many rows), at most batch_size, within the token budget of one
        forward pass and the logits budget (one row of logits per slot); at least one."""
        longest = max(len(r.context) - shared + r.max_gen_toks for r in requests)
        widest = max(len(r.context) for r in requests) - shared  # a prefill row: the whole context where unshared
        fits = slots_fitting(self.kv_tokens, shared or widest, longest, widest)
        return max(1, min(len(requests), self.batch_size or fits, fits, self.token_budget, self._max_rows))

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        """One Generated per request, in the given order."""
        for i, request in enumerate(requests):
            self._check(i, request)
        self.tokens_in_requests += sum(len(r.context) for r in requests)
        results: list[Generated | None] = [None] * len(requests)
        todo = [i for i, r in enumerate(requests) if r.max_gen_toks > 0]
        for i, request in enumerate(requests):
            if request.max_gen_toks == 0:
                results[i] = Generated("", 0)
        if todo:
            contexts = sorted(requests[i].context for i in todo)
            shared = min(common_prefix_length(contexts[0], contexts[-1]), len(min(contexts, key=len)) - 1)
            if not (self.shares_prefix and shared >= SHARED_PREFIX_MIN_TOKENS):
                shared = 0

            def runs(pending: list[int], _tokens: int):
                # After an out-of-memory error: the requests not answered yet, in slots sized for the cut budget.
                left = [i for i in pending if results[i] is None]
                slots = self.slots_for([requests[i] for i in left], shared) if left else 1
                yield (left, slots), pending, slots == 1

            halving_on_oom(todo, runs, lambda run: _Run(self, requests, run[0], results, shared).run(run[1]),
                           self.budget)
        return results  # type: ignore[return-value]

    def _check(self, i: int, request: GenerationRequest) -> None:
        n = len(request.context)
        if n == 0:
            raise RequestDoesNotFit(i, f"generation request {i} has no context tokens: the first new token would "
                                       "follow nothing")
        if request.max_gen_toks < 0:
            raise RaylmError(f"generation request {i}: max_gen_toks {request.max_gen_toks} is negative")
        if self.max_positions is not None and n + request.max_gen_toks > self.max_positions:
            raise RequestDoesNotFit(i, f"generation request {i}: {n} context tokens plus max_gen_toks "
                                       f"{request.max_gen_toks} exceed the model's {self.max_positions} positions "
                                       "(the context must be left-truncated to max_length - max_gen_toks first)")
        if request.do_sample and not (request.temperature > 0 and request.top_k >= 0 and 0 < request.top_p <= 1):
            raise RaylmError(f"generation request {i}: sampling needs temperature > 0, top_k >= 0 and 0 < top_p <= 1 "
                             f"(got {request.temperature}, {request.top_k}, {request.top_p})")


class _Run:
    """One generate() call: requests admitted in sorted order into free slots, decoded one token per step.

    shared > 0: the call's requests all begin with `shared` tokens, kept once on the path for the whole call; the
    slots and prefills hold only the tokens after them, and every forward pass attends to the path first (the model
    switched to shared_prefix_attention for it), at the rows' true positions."""

    def __init__(self, gen: Generator, requests: Sequence[GenerationRequest], todo: list[int],
                 results: list[Generated | None], shared: int = 0):
        self.gen, self.requests, self.results, self.shared = gen, requests, results, shared
        self.order = sorted(todo, key=lambda i: requests[i].context)
        # shares[k]: the prefix order[k] shares with order[k + 1]
        self.shares = [common_prefix_length(requests[a].context, requests[b].context)
                       for a, b in zip(self.order, self.order[1:])]
        self.path = PrefixPath()
        self.slots = Slots()
        # the sequence in each of the slots' rows, None where it stopped: a stopped row is refilled in place by the
        # next admission, or dropped once stopped rows are half of them and nothing is left to admit
        self.batch: list[_Sequence | None] = []

    @property
    def alive(self) -> int:
        return sum(seq is not None for seq in self.batch)

    def run(self, slots: int) -> None:
        self.capacity = slots
        k = 0
        while k < len(self.order) or self.alive:
            if k < len(self.order) and self.alive < slots:
                n = min(slots - self.alive, len(self.order) - k)
                self.admit(k, n)
                k += n
            elif 2 * self.alive <= len(self.batch):
                rows = [r for r, seq in enumerate(self.batch) if seq is not None]
                self.slots.keep(rows)
                self.batch = [self.batch[r] for r in rows]
            if self.alive:
                self.step()

    def admit(self, k: int, n: int) -> None:
        """Prefill order[k:k + n] over the path of the prefix they share, and give each its first token."""
        members = self.order[k:k + n]
        contexts = [self.requests[i].context for i in members]
        # what the slots are reserved as wide as, on the first admission
        self.widest = max(len(c) for c in contexts) - self.shared
        shortest = min(len(c) for c in contexts) - 1  # each request prefills at least its last token itself
        if self.shared:
            share = shortest = self.shared
        elif n > 1:
            share = min(self.shares[k:k + n - 1])
        else:  # a lone request caches what it shares with either neighbour, for the next admission to reuse
            share = max(self.shares[k - 1] if k > 0 else 0, self.shares[k] if k < len(self.shares) else 0)
        used = min(min(self.path.shared_with(c) for c in contexts), shortest)
        target = max(used, min(share, shortest))
        gen = self.gen
        gen.prefilled_tokens += self.path.set(gen.model, gen.device, contexts[0][:target], gen.token_budget)
        chunk: list[int] = []
        widest = 0
        for i in members:
            # A row costs its whole context: its suffix attends to all of it, the path copied into the row or, held
            # once, through attention scores over it that are as many.
            width = len(self.requests[i].context)
            if chunk and (len(chunk) + 1) * max(widest, width) > gen.token_budget:
                self.prefill(chunk, target)
                chunk, widest = [], 0
            chunk.append(i)
            widest = max(widest, width)
        self.prefill(chunk, target)

    def prefill(self, members: list[int], target: int) -> None:
        """Run the members' contexts past the path's `target` tokens, right-padded in one batch (padding follows
        every real token, so no mask is needed), and move the sequences that go on into the slots. Over the prefix
        the call holds once, the rows attend to it there, at their true positions after it; over any other path,
        to a copy of it in each row."""
        gen = self.gen
        suffixes = [self.requests[i].context[target:] for i in members]
        width = max(len(s) for s in suffixes)
        ids = torch.zeros(len(members), width, dtype=torch.long)
        for r, suffix in enumerate(suffixes):
            ids[r, :len(suffix)] = torch.tensor(suffix)
        last = torch.tensor([r * width + len(s) - 1 for r, s in enumerate(suffixes)], device=gen.device)
        with gather_head_inputs(gen.head, last, len(members), width):
            if self.shared:
                cache = DynamicCache()
                positions = torch.arange(target, target + width, device=gen.device).expand(len(members), -1)
                with prefix_attention(gen.model), attending_to(self.path.cache):
                    logits = forward(gen.model, ids.to(gen.device), cache, position_ids=positions).logits[0]
            else:
                cache = self.path.for_rows(len(members))
                logits = forward(gen.model, ids.to(gen.device), cache).logits[0]
        gen.prefilled_tokens += sum(len(s) for s in suffixes)
        batch = [self.start(i) for i in members]
        going = [r for r, (seq, token) in enumerate(zip(batch, self.choose(logits, batch)))
                 if not self.stops(seq, token)]
        if self.slots.cache is None:
            self.slots.reserve(cache, self.capacity, self.widest)
            self.batch = [None] * self.capacity
        free = [r for r, seq in enumerate(self.batch) if seq is None]
        rows = self.slots.add(cache, going, [target - self.shared + len(suffixes[r]) for r in going], free)
        for r, row in zip(going, rows):
            if row < len(self.batch):
                self.batch[row] = batch[r]
            else:
                self.batch.append(batch[r])

    def step(self) -> None:
        """One new token for every slot."""
        gen = self.gen
        # A stopped row is fed token 0 at position 0 (its position would otherwise grow past the model's): what it
        # computes is never read, and no other row attends to it.
        ids = torch.tensor([[seq.watch.ids[-1] if seq is not None else 0] for seq in self.batch], device=gen.device)
        mask, positions = self.slots.step_inputs(gen.device)
        positions += self.shared
        positions[[r for r, seq in enumerate(self.batch) if seq is None]] = 0
        kwargs = {"attention_mask": mask}
        if gen.takes_positions:
            kwargs["position_ids"] = positions
        if self.shared:
            with prefix_attention(gen.model), attending_to(self.path.cache):
                logits = forward(gen.model, ids, self.slots.cache, **kwargs).logits[:, -1]
        else:
            logits = forward(gen.model, ids, self.slots.cache, **kwargs).logits[:, -1]
        for r, (seq, token) in enumerate(zip(self.batch, self.choose(logits, self.batch))):
            if seq is not None and self.stops(seq, token):
                self.batch[r] = None
        self.slots.trim([r for r, seq in enumerate(self.batch) if seq is not None])

    def start(self, i: int) -> _Sequence:
        request = self.requests[i]
        seq = _Sequence(i, StopWatch(self.gen.tokenizer, request.until))
        if request.do_sample:
            if request.temperature != 1.0:
                seq.warpers.append(TemperatureLogitsWarper(request.temperature))
            if request.top_k:
                seq.warpers.append(TopKLogitsWarper(request.top_k))
            if request.top_p < 1.0:
                seq.warpers.append(TopPLogitsWarper(request.top_p))
            seq.generator = torch.Generator().manual_seed(request.seed)
        return seq

    def choose(self, logits: torch.Tensor, batch: Sequence[_Sequence | None]) -> list[int]:
        """Each row's next token: argmax for greedy rows; for sampled ones HF's warpers on float32 logits (as HF
        generate casts them), then one draw from the request's own generator, on the CPU so it is the same draw
        whatever the device."""
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for r, seq in enumerate(batch):
            if seq is None or seq.generator is None:
                out.append(greedy[r])
                continue
            scores = logits[r:r + 1].float()
            for warper in seq.warpers:
                scores = warper(None, scores)
            probs = torch.softmax(scores, dim=-1)[0].cpu()
            out.append(int(torch.multinomial(probs, 1, generator=seq.generator)))
        return out

    def stops(self, seq: _Sequence, token: int) -> bool:
        """Take a new token; True when the sequence is done, its answer then in results."""
        request = self.requests[seq.request]
        self.gen.generated_tokens += 1
        hit = seq.watch.push(token)
        if not (hit or token in self.gen.eos_ids or len(seq.watch.ids) >= request.max_gen_toks):
            return False
        self.results[seq.request] = Generated(final_text(self.gen.tokenizer, seq.watch.ids, request.until),
                                              len(seq.watch.ids))
        return True


def eos_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    """The ids HF generate stops a sequence on: the model's generation_config eos (an id or a list), else the
    tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([int(eos)] if isinstance(eos, int) else (int(e) for e in eos))


def _alibi(model: torch.nn.Module) -> bool:
    """Whether the model's modeling module builds ALiBi biases (BLOOM, MPT): those read positions from the mask."""
    return any("alibi" in name.lower() for name in vars(inspect.getmodule(type(model))))
