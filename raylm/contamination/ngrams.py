"""Benchmark text -> lm-eval's decontamination n-grams; a batch of corpus texts -> the task n-grams it contains.

Normalisation and n-grams are lm-eval's (lm_eval/decontamination): `Janitor.normalize_string` lower-cases ASCII
letters and deletes `string.punctuation`, touching nothing else (no Unicode case folding, no other symbols), and
`word_ngrams` splits on whitespace and joins each run of n words with one space. Both sides are normalised whole
before they are split, as lm-eval's decontaminate.py does to task documents and
scripts/clean_training_data/generate_13_grams.py to training documents. (`Janitor.clean` builds its n-grams from
the raw words and normalises each afterwards, so a word made only of punctuation, such as "--", leaves an empty
word inside the n-gram that no task n-gram has: that path would miss real overlaps, and raylm does not take it.)
A text of fewer than n words has no n-grams and can never be found, as in lm-eval.

The corpus side is the hot loop, so it builds no n-gram strings: a batch's texts are split in Arrow, every task
word gets an integer id and a corpus word no task uses gets -1 (Arrow's index_in), and each window of n known
words is hashed (a polynomial hash in uint64, vectorised with numpy over the batch). A window whose hash is a
task n-gram's is a candidate; the driver confirms it by comparing the n-gram's text itself (NgramIndex.owners),
so a hash collision can never make a document dirty.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raylm.contamination import DEFAULT_NGRAM

# Janitor's translation: ASCII upper case to lower case, string.punctuation deleted, every other character kept.
# All of it is ASCII, and in UTF-8 an ASCII byte is only ever that character, so the same translation of the
# UTF-8 bytes is the same text; bytes.translate runs it about ten times faster than str.translate.
_LOWER = bytes.maketrans(string.ascii_uppercase.encode(), string.ascii_lowercase.encode())
_PUNCTUATION = string.punctuation.encode()
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplying by it mod 2**64 loses nothing
_WORD = re.compile(r"\S+")  # the words str.split() yields, with where each starts


def normalize(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").translate(_LOWER, _PUNCTUATION).decode("utf-8", "surrogatepass")


def words(text: str) -> list[str]:
    return normalize(text).split()


def ngrams(word_list: list[str], n: int) -> list[str]:
    """Every run of n consecutive words, joined by one space, in order (repeats kept)."""
    return [" ".join(word_list[i:i + n]) for i in range(len(word_list) - n + 1)]


def word_starts(text: str) -> list[int]:
    """Where in `text` (a code-point index) each of words(text) begins.

    Deleting punctuation never creates or removes whitespace, so the normalised words are the raw
    whitespace-separated words, normalised, less those that were all punctuation."""
    return [m.start() for m in _WORD.finditer(text) if normalize(m.group())]


def window_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window of n consecutive ids (len(ids) - n + 1 of them), wrapping mod 2**64."""
    count = len(ids) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    unsigned = ids.astype(np.uint64)
    out = np.zeros(count, dtype=np.uint64)
    for j in range(n):
        out = out * _HASH_BASE + unsigned[j:j + count]
    return out


def known_windows(ids: np.ndarray, n: int) -> np.ndarray:
    """For each window of n ids, whether every id in it is a task word (>= 0)."""
    unknown = np.concatenate([[0], np.cumsum(ids < 0)])
    return unknown[n:] - unknown[:-n] == 0 if len(ids) >= n else np.zeros(0, dtype=bool)


@dataclass(frozen=True)
class Candidate:
    """A window of a corpus text whose hash is a task n-gram's: `doc` is the text's index in its batch."""

    doc: int
    word: int  # index of its first word among the text's normalised words
    offset: int  # code-point index of that word in the original text
    ngram: str


@dataclass
class NgramFilter:
    """What each scanning actor holds: the task words (an id each, their position in `words`), the sorted hashes of
    every task n-gram, and a bitmap of the hashes' top bits that rejects most windows with one lookup before the
    binary search."""

    n: int
    vocab: dict[str, int]
    hashes: np.ndarray
    words: pa.Array = field(init=False, repr=False)
    bitmap: np.ndarray = field(init=False, repr=False)
    shift: np.uint64 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.words = pa.array(sorted(self.vocab, key=self.vocab.__getitem__), pa.string())
        bits = int(min(26, max(16, math.ceil(math.log2(max(1, len(self.hashes)) * 16)))))  # at most 1/16 full
        self.shift = np.uint64(64 - bits)
        self.bitmap = np.zeros(1 << bits, dtype=bool)
        self.bitmap[self.hashes >> self.shift] = True

    def candidates(self, texts: list[str]) -> list[Candidate]:
        """Every window of the texts whose hash is a task n-gram's, in text order then word order.

        Splitting and the word-id lookup run in Arrow over the whole batch (utf8_split_whitespace splits on the
        characters str.split() does); each text's words are followed by an unknown id, so no window spans two."""
        lists = pc.utf8_split_whitespace(pa.array([normalize(t) for t in texts], pa.string()))
        every = lists.flatten()
        kept = pc.not_equal(pc.binary_length(every), 0).to_numpy(zero_copy_only=False)  # split() drops ""
        flat = every.filter(pa.array(kept))
        counted = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])
        offsets = lists.offsets.to_numpy()
        starts, ends = counted[offsets[:-1]], counted[offsets[1:]]
        known = pc.index_in(flat, value_set=self.words).fill_null(-1).to_numpy(zero_copy_only=False)
        ids = np.insert(known.astype(np.int64), ends, -1)
        positions = np.flatnonzero(known_windows(ids, self.n))
        if not len(positions) or not len(self.hashes):
            return []
        found = window_hashes(ids, self.n)[positions]
        maybe = self.bitmap[found >> self.shift]
        positions, found = positions[maybe], found[maybe]
        slot = np.minimum(np.searchsorted(self.hashes, found), len(self.hashes) - 1)
        hits = positions[self.hashes[slot] == found]
        separated = starts + np.arange(len(texts))  # where each text's words start in `ids`
        out: list[Candidate] = []
        offsets_of: dict[int, list[int]] = {}
        for p in hits.tolist():
            doc = int(np.searchsorted(separated, p, side="right")) - 1
            k = p - int(separated[doc])
            if doc not in offsets_of:
                offsets_of[doc] = word_starts(texts[doc])
            first = int(starts[doc]) + k
            out.append(Candidate(doc, k, offsets_of[doc][k], " ".join(flat.slice(first, self.n).to_pylist())))
        return out


@dataclass(frozen=True)
class TaskDocument:
    task: str
    doc_id: int
    words: list[str]


class NgramIndex:
    """Every task document's n-grams, on the driver: the filter the actors scan with, and the exact check that a
    candidate is a task n-gram (and of which documents, at which words)."""

    def __init__(self, documents: list[TaskDocument], n: int = DEFAULT_NGRAM):
        if n < 1:
            raise ValueError(f"n-gram size must be at least 1, got {n}")
        self.n = n
        self.documents = documents
        vocab: dict[str, int] = {}
        for doc in documents:
            for w in doc.words:
                vocab.setdefault(w, len(vocab))
        hashes, owner, position = [], [], []
        for d, doc in enumerate(documents):
            ids = np.fromiter((vocab[w] for w in doc.words), dtype=np.int64, count=len(doc.words))
            h = window_hashes(ids, n)
            hashes.append(h)
            owner.append(np.full(len(h), d, dtype=np.int64))
            position.append(np.arange(len(h), dtype=np.int64))
        every = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        order = np.argsort(every, kind="stable")
        self._hashes = every[order]
        self._owner = np.concatenate(owner)[order] if owner else np.zeros(0, dtype=np.int64)
        self._position = np.concatenate(position)[order] if position else np.zeros(0, dtype=np.int64)
        self.filter = NgramFilter(n, vocab, np.unique(self._hashes))

    @property
    def ngram_count(self) -> int:
        """Task n-grams, repeats within and across documents counted."""
        return len(self._hashes)

    def owners(self, ngram: str) -> list[tuple[int, int]]:
        """(document index, word index) of every occurrence of this exact n-gram among the task documents."""
        ids = [self.filter.vocab.get(w, -1) for w in ngram.split(" ")]
        if len(ids) != self.n or min(ids) < 0:
            return []
        h = window_hashes(np.asarray(ids, dtype=np.int64), self.n)[0]
        lo, hi = np.searchsorted(self._hashes, h, side="left"), np.searchsorted(self._hashes, h, side="right")
        out = []
        for d, k in zip(self._owner[lo:hi].tolist(), self._position[lo:hi].tolist()):
            if " ".join(self.documents[d].words[k:k + self.n]) == ngram:
                out.append((d, k))
        return out
