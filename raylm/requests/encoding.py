"""Text -> token ids exactly as lm-evaluation-harness 0.4.13 (HFLM) builds them.

Matching lm-eval here is what makes raylm's numbers trustworthy to someone switching tools, so each quirk is
kept on purpose: the tokenizer's own special-token default (a Llama tokenizer prepends BOS to context and
whole alike), trailing context spaces moved into the continuation, continuation = tail of the joint encoding,
the prefix token for an empty context only (a context of whitespace is encoded, not treated as empty).
The one exception is refused rather than copied: a tokenizer that appends a special token (EOS) to every
encoding, where lm-eval's tail would silently drop the continuation's first real token and score that EOS.
(Rolling windows are raylm.requests.windows.)
"""

from __future__ import annotations

from collections.abc import Sequence

from raylm.errors import RaylmError


def prefix_token_id(tokenizer, custom: int | None = None) -> int:
    """The token that conditions an empty context and the first rolling window: HFLM's prefix_token_id when given,
    else BOS, else EOS."""
    if custom is not None:
        if custom >= len(tokenizer):
            raise ValueError(f"prefix_token_id {custom} is not in the vocabulary of tokenizer "
                             f"{getattr(tokenizer, 'name_or_path', '')!r} ({len(tokenizer)} tokens)")
        return custom
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError(
        f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a BOS nor an EOS token, so there is no "
        "prefix token to condition empty contexts and rolling windows on"
    )


class Encoder:
    """HFLM's tok_encode and _encode_pair. `add_bos_token` and `custom_prefix` are HFLM's add_bos_token and
    prefix_token_id: None keeps the tokenizer's special-token default and BOS-else-EOS."""

    def __init__(self, tokenizer, max_length: int, add_bos_token: bool | None = None,
                 custom_prefix: int | None = None):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.prefix_token = prefix_token_id(tokenizer, custom_prefix)
        self._prefix_text = tokenizer.decode(self.prefix_token)
        self._special = frozenset(tokenizer.all_special_ids)
        self._default = {} if add_bos_token is None else {"add_special_tokens": add_bos_token}

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """HFLM.tok_encode with add_special_tokens left unset: the tokenizer's default (or add_bos_token when set),
        except that text already starting with the prefix token's text (a chat template that writes BOS itself)
        is encoded without special tokens, so BOS is not doubled."""
        return self._encode(texts, self._prefix_text)

    def encode_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        """Generation prompts as HFLM.tok_batch_encode encodes them: as encode_many, but the text that turns
        special tokens off is the tokenizer's BOS token (none without one). HFLM decides this for a whole batch by
        its first prompt; per prompt is the same wherever a batch's prompts agree, and does not depend on how they
        were batched."""
        return self._encode(texts, getattr(self.tokenizer, "bos_token", None))

    def _encode(self, texts: Sequence[str], marker: str | None) -> list[list[int]]:
        """Each distinct text through the tokenizer once: a multiple-choice task's choices repeat their context
        (MMLU's four, each over a five-shot prompt), and an encoding is a function of the text alone."""
        distinct = list(dict.fromkeys(texts))
        marked = [bool(marker) and t.startswith(marker) for t in distinct]
        encoded: dict[str, list[int]] = {}
        for flag, kwargs in ((False, self._default), (True, {"add_special_tokens": False})):
            batch = [t for t, m in zip(distinct, marked) if m == flag]
            if batch:
                encoded.update(zip(batch, map(list, self.tokenizer(batch, **kwargs)["input_ids"])))
        return [list(encoded[t]) for t in texts]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) strings -> (context ids, continuation ids), batched through the tokenizer.

        Only a context that is exactly "" is conditioned on the prefix token, as in lm-eval's loglikelihood; a
        context of whitespace alone goes through _encode_pair like any other (its spaces moved into the
        continuation), so it is the tokenizer's encoding of "": BOS for a Llama tokenizer, and no token at all for
        GPT-2's, a request lm-eval cannot score (HFLM asserts a non-empty context) and raylm's tables refuse."""
        moved = [_move_trailing_space(c, k) for c, k in pairs]
        with_context = [i for i, (c, _) in enumerate(pairs) if c]
        wholes = self.encode_many([moved[i][0] + moved[i][1] for i in with_context])
        contexts = self.encode_many([moved[i][0] for i in with_context])
        out: list[tuple[list[int], list[int]]] = [([], []) for _ in pairs]
        for i, whole, context in zip(with_context, wholes, contexts):
            self._check_context_is_prefix(context, whole)
            out[i] = (context, whole[len(context):])
        for i, (context, continuation) in enumerate(pairs):
            if not context:
                out[i] = self._empty_context(continuation)
        return out

    def _check_context_is_prefix(self, context: list[int], whole: list[int]) -> None:
        """The continuation is whole[len(context):], as in lm-eval; that is only its own tokens if the context's
        encoding starts the whole's. Where it does not because the context's encoding ends in a special token the
        joint one lacks there, the tokenizer appends it (EOS) to everything: lm-eval 0.4.13 then scores that EOS in
        place of the continuation's first token, silently. (Other mismatches, a token merging across the
        boundary, keep lm-eval's split.)"""
        n = len(context)
        if context and context[-1] in self._special and whole[:n] != context:
            name = getattr(self.tokenizer, "name_or_path", "")
            token = self.tokenizer.convert_ids_to_tokens(context[-1])
            raise RaylmError(f"tokenizer '{name}' appends {token!r} to every encoding, so each continuation would "
                             f"lose its first token and score {token!r} instead (lm-eval 0.4.13 does so silently); "
                             "load it without that (e.g. add_eos_token: false in its tokenizer_config.json)")

    def _empty_context(self, continuation: str) -> tuple[list[int], list[int]]:
        ids = list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])
        if ids and ids[0] == self.prefix_token:
            return ids[:1], ids[1:]
        return [self.prefix_token], ids


def _move_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    stripped = context.rstrip()
    return stripped, context[len(stripped):] + continuation
