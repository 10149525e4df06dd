"""Text -> what a masked LM scores: (context, continuation) pairs and documents cut into windows.

A masked-LM request is context + continuation + following, of which only the continuation is masked and scored
(raylm.scoring.mlm). The rules, and why:
- The model sees `[CLS] context continuation [SEP]` (the tokenizer's own template: `<s> ... </s>` for RoBERTa),
  tokenised once, as one text: that is how the model met text in training, and one encoding is where the word
  boundaries word-l2r needs come from (`word_ids()` of a fast tokenizer: its pre-tokeniser's words, so
  punctuation is a word of its own, as minicons counts words).
- The continuation is the tail of that encoding after as many tokens as the context alone encodes to, and
  trailing context whitespace moves into the continuation: lm-eval's causal rule (HFLM._encode_pair), so a
  masked and a causal model score the same text of the same request, and minicons'
  `conditional_score(prefix, stimuli, separator="")` scores exactly the same tokens.
- Continuation tokens that are the tokenizer's CLS/SEP/PAD/BOS/EOS (a literal "[SEP]" in the text) stay visible
  but are not scored, as minicons skips them.
- A request longer than the model drops context from the left, after the opening special tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raylm.requests.encoding import _move_trailing_space

# The word id of a continuation token that is neither masked nor scored (a special token); raylm.scoring.mlm reads it.
UNSCORED = -1


@dataclass(frozen=True)
class MaskedRequest:
    """`word_ids` gives each continuation token its word (tokens of one word share a value; UNSCORED marks a
    special token); `following` is the closing special token(s), after right context for a corpus window;
    `dropped` counts context tokens cut to fit the model."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]
    following: tuple[int, ...]
    word_ids: tuple[int, ...]
    dropped: int = 0

    @property
    def length(self) -> int:
        return len(self.context) + len(self.continuation) + len(self.following)


class MaskedEncoder:
    """Builds MaskedRequests with one tokenizer for a model taking `max_length` tokens."""

    def __init__(self, tokenizer, max_length: int):
        name = getattr(tokenizer, "name_or_path", "")
        if tokenizer.mask_token_id is None:
            raise ValueError(f"tokenizer {name!r} has no mask token, so it cannot be scored as a masked LM")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"tokenizer {name!r} is not a fast tokenizer; masked-LM scoring needs its word_ids()")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.unscored_ids = frozenset(i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id,
                                                  tokenizer.pad_token_id, tokenizer.bos_token_id,
                                                  tokenizer.eos_token_id) if i is not None)
        probe = tokenizer("a", return_special_tokens_mask=True)
        special = probe["special_tokens_mask"]
        self.n_opening = _leading(special)
        self.n_closing = _leading(special[::-1])
        ids = probe["input_ids"]
        self.opening = tuple(ids[:self.n_opening])
        self.closing = tuple(ids[len(ids) - self.n_closing:])
        if max_length <= self.n_opening + self.n_closing:
            raise ValueError(f"a max length of {max_length} leaves no room besides the special tokens")

    @property
    def room(self) -> int:
        """Tokens a window holds besides the special tokens."""
        return self.max_length - self.n_opening - self.n_closing

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[MaskedRequest]:
        """One request per (context, continuation), batched through the tokenizer; a request too long even
        without its context is returned whole, for the caller to report."""
        if not pairs:
            return []  # a fast tokenizer fails on an empty batch
        moved = [_move_trailing_space(c, k) for c, k in pairs]
        wholes = self.tokenizer([c + k for c, k in moved])
        contexts = self.tokenizer([c for c, _ in moved], add_special_tokens=False)["input_ids"]
        out = []
        for i, context in enumerate(contexts):
            ids, word_ids = wholes["input_ids"][i], wholes.word_ids(i)
            split, closing = self.n_opening + len(context), len(ids) - self.n_closing
            words = tuple(self._word(ids[j], word_ids[j]) for j in range(split, closing))
            out.append(self._fit(MaskedRequest(tuple(ids[:split]), tuple(ids[split:closing]),
                                               tuple(ids[closing:]), words)))
        return out

    def document_windows(self, texts: Sequence[str], stride: int | None = None) -> list[list[MaskedRequest]]:
        """Each document's tokens, each scored exactly once, in windows of up to max_length tokens.

        Consecutive spans of at most `stride` tokens (default: a whole window's room) end at word starts, so a
        word's pieces are always scored in the same window and word-l2r never reaches past one. Each span is
        scored in one window that puts the rest of the window's room around it, half before and half after where
        the document allows, since a masked LM reads both ways. The encoder's work does not depend on the stride
        (each scored token is one copy of its window): a smaller stride only centres tokens in more context.
        """
        stride = self.room if stride is None else stride
        if not 0 < stride <= self.room:
            raise ValueError(f"stride must be between 1 and {self.room} (max length less special tokens), "
                             f"got {stride}")
        if not texts:
            return []  # a fast tokenizer fails on an empty batch
        encoded = self.tokenizer(list(texts), add_special_tokens=False)
        out = []
        for i in range(len(texts)):
            ids = encoded["input_ids"][i]
            words = [self._word(t, w) for t, w in zip(ids, encoded.word_ids(i))]
            out.append(self._windows(ids, words, stride))
        return out

    def _windows(self, body: list[int], words: list[int], stride: int) -> list[MaskedRequest]:
        width = min(self.room, len(body))
        out = []
        start = 0
        while start < len(body):
            end = _span_end(words, start, stride)
            if end - start > self.room:
                raise ValueError(f"a word of {end - start} tokens does not fit in a window of {self.room}")
            lo = min(max(0, start - (width - (end - start)) // 2), len(body) - width)
            out.append(MaskedRequest(self.opening + tuple(body[lo:start]), tuple(body[start:end]),
                                     tuple(body[end:lo + width]) + self.closing, tuple(words[start:end])))
            start = end
        return out

    def _word(self, token: int, word: int | None) -> int:
        return UNSCORED if word is None or token in self.unscored_ids else word

    def _fit(self, request: MaskedRequest) -> MaskedRequest:
        excess = request.length - self.max_length
        if excess <= 0 or excess > len(request.context) - self.n_opening:
            return request
        kept = request.context[:self.n_opening] + request.context[self.n_opening + excess:]
        return MaskedRequest(kept, request.continuation, request.following, request.word_ids, excess)


def _span_end(words: Sequence[int], start: int, stride: int) -> int:
    """The last word start within `stride` tokens of `start` (or the end); past it when one word is longer."""
    limit = start + stride
    if limit >= len(words):
        return len(words)
    end = limit
    while end > start and words[end] == words[end - 1]:
        end -= 1
    if end > start:
        return end
    end = limit
    while end < len(words) and words[end] == words[end - 1]:
        end += 1
    return end


def _leading(flags: Sequence[int]) -> int:
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n
