"""Generated text as lm-eval's HFLM sees it: stop strings watched as tokens arrive, and the final cut.

HFLM (lm-eval 0.4.13) stops a sequence when a stop string appears in the decoded tail of its new tokens, decoded
*with* special tokens (a chat model's end-of-turn marker is a stop string as text), and then decodes all new tokens
*without* special tokens and cuts the text at each stop string in turn. The watch here finds a stop at the first
token whose text completes it, decoding only a short window per token (vLLM's incremental detokenisation: the
window starts a few tokens back, so a SentencePiece leading space or an unfinished UTF-8 byte sequence comes out as
it does in the whole text). A hit is confirmed on the whole decoded text before the sequence stops, so a tokenizer
whose window text drifts from its whole text can make the watch stop late (as HFLM's own lookback may), never
early; the final text is always the whole decode, cut, so it does not depend on when the watch fired.
"""

from __future__ import annotations

from collections.abc import Sequence

INCOMPLETE = "\ufffd"  # what a decoder shows for a byte-fallback token that does not finish a character yet


class StopWatch:
    """One sequence's new tokens and the text they decode to so far, with special tokens, as HFLM's criterion
    decodes them."""

    def __init__(self, tokenizer, until: Sequence[str]):
        self.tokenizer = tokenizer
        self.until = [term for term in until if term]
        self.longest = max((len(term) for term in self.until), default=0)
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0  # the window: ids[_prefix:_read] decode to text already taken

    def push(self, token: int) -> bool:
        """Add a token; True once a stop string is in the text."""
        self.ids.append(token)
        if not self.until:
            return False
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return False
        start = len(self.text)
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        tail = self.text[max(0, start - self.longest + 1):]
        if not any(term in tail for term in self.until):
            return False
        whole = self._decode(self.ids)
        return any(term in whole for term in self.until)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def final_text(tokenizer, new_tokens: Sequence[int], until: Sequence[str]) -> str:
    """HFLM's answer: the new tokens decoded without special tokens, cut before each non-empty stop string in
    turn (lm-eval's postprocess_generated_text)."""
    text = tokenizer.decode(list(new_tokens), skip_special_tokens=True)
    for term in until:
        if term:
            text = text.split(term)[0]
    return text
