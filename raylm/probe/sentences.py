"""A probe file and a tokenizer -> the masked sentences to run, and each target's token at each sentence's mask.

A template runs once per combination of the fill values it uses. Every target is compared on the same masked
input, so two targets' scores differ only by what the model predicts at the mask; that is sound only if writing
the target in place of the mask changes nothing else, so each target must tokenise, in each sentence, to exactly
one token at the mask with every other token unchanged (a byte-level BPE's "Ġshe" after a space, "she" at the
start of a text: the same target may be a different token in different sentences).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from raylm.probe.file import GENERIC_MASK, Located, ProbeFile, placeholders


@dataclass(frozen=True)
class ProbeSentence:
    template: int  # index into the probe file's templates
    fills: tuple[tuple[str, str], ...]  # (placeholder, value) in the fill mapping's order
    text: str  # as the model reads it, with the model's own mask token
    ids: tuple[int, ...]
    mask: int  # the mask token's position in ids
    targets: tuple[int, ...]  # each target's token id at the mask, in the probe file's order


def with_model_mask(text: str, tokenizer) -> str:
    """[MASK] written as the model's own mask token (RoBERTa's <mask>); the model's own spelling is kept."""
    return text.replace(GENERIC_MASK, tokenizer.mask_token)


def mask_positions(ids: list[int] | tuple[int, ...], tokenizer) -> list[int]:
    return [i for i, t in enumerate(ids) if t == tokenizer.mask_token_id]


def build_sentences(probes: ProbeFile, tokenizer) -> list[ProbeSentence]:
    names = list(probes.fill)
    out = []
    for index, template in enumerate(probes.templates):
        used = [n for n in names if n in placeholders(probes, template)]
        for values in itertools.product(*(probes.fill[n] for n in used)):
            fills = tuple((n, v.text) for n, v in zip(used, values))
            text = with_model_mask(template.text.format(**dict(fills)), tokenizer)
            ids = tuple(tokenizer(text)["input_ids"])
            masks = mask_positions(ids, tokenizer)
            if len(masks) != 1:
                what = "no mask" if not masks else f"{len(masks)} masks"
                raise probes.fail(template, f"{text!r} has {what}; a probe template needs exactly one "
                                            f"({GENERIC_MASK} or the model's own {tokenizer.mask_token})")
            targets = tuple(_target_id(probes, tokenizer, text, ids, masks[0], t) for t in probes.targets)
            out.append(ProbeSentence(index, fills, text, ids, masks[0], targets))
    return out


def _target_id(probes: ProbeFile, tokenizer, text: str, ids: tuple[int, ...], mask: int, target: Located) -> int:
    filled = tokenizer(text.replace(tokenizer.mask_token, target.text, 1))["input_ids"]
    if len(filled) == len(ids) and all(a == b for i, (a, b) in enumerate(zip(ids, filled)) if i != mask):
        return filled[mask]
    shortest = min(len(ids), len(filled))
    prefix = next((i for i in range(shortest) if ids[i] != filled[i]), shortest)
    suffix = next((i for i in range(shortest - prefix) if ids[-1 - i] != filled[-1 - i]), shortest - prefix)
    pieces = tokenizer.convert_ids_to_tokens(filled[prefix:len(filled) - suffix])
    raise probes.fail(target, f"{target.text!r} does not read as one token in place of the mask in {text!r} (it "
                              f"reads as {len(pieces)}: {' '.join(pieces)}); a target must be one token of the "
                              "model's vocabulary")
