"""Masked LMs for the benchmarks, built offline and cached: seeded random weights on a real WordPiece vocabulary.

The vocabulary is trained here with `tokenizers` on the shared fixture text (BERT's normaliser and pre-tokeniser,
lower-cased: the bert-base-uncased recipe). BERT-base's 30522 entries need more distinct words than the task
fixtures hold, so BoolQ passages (Wikipedia) and PIQA join them. Random weights score like any other weights:
what the benchmark measures is the arithmetic, and that depends only on the shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from common import CACHE, DATA

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SEED = 1234
# name -> (vocabulary size, BertConfig shape)
SHAPES = {
    "bert-base": (30522, dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                              max_position_embeddings=512)),
    "tiny": (8192, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=256)),
}


def text_lines() -> Iterator[str]:
    import datasets

    for folder, fields in ((DATA / "hf/aps/super_glue/boolq/validation", ("passage", "question")),
                           (DATA / "hf/baber/piqa/none/validation", ("goal", "sol1", "sol2"))):
        table = datasets.load_from_disk(str(folder)).data.table
        for field in fields:
            yield from table.column(field).to_pylist()
    for name in ("valid.txt", "test.txt"):
        yield from (line for line in (DATA / "wikitext-2" / name).read_text(encoding="utf-8").splitlines()
                    if line.strip())
    for line in (DATA / "hellaswag" / "validation.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        yield row["activity_label"] + ": " + row["ctx"]
        yield from row["endings"]
    for name in ("dev.jsonl", "train_s.jsonl"):
        for line in (DATA / "winogrande" / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            yield row["sentence"].replace("_", row["option1"])


def wordpiece_tokenizer(vocab_size: int, max_length: int):
    """A fast BERT tokenizer over a WordPiece vocabulary trained on the shared text. Its saved tokenizer.json
    loads in transformers 4.57 (minicons' side) and 5.x alike, with the same ids."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast

    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(text_lines(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    vocab = tok.get_vocab()
    if len(vocab) != vocab_size:
        print(f"note: the WordPiece vocabulary reached {len(vocab)} entries, not {vocab_size}")
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return BertTokenizerFast(vocab=vocab, tokenizer_object=tok, do_lower_case=True, model_max_length=max_length)


def masked_model(name: str) -> Path:
    """A cached BertForMaskedLM of the named shape (CACHE/<name>-mlm), built on first use."""
    path = CACHE / f"{name}-mlm"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import BertConfig, BertForMaskedLM

    vocab_size, shape = SHAPES[name]
    tokenizer = wordpiece_tokenizer(vocab_size, shape["max_position_embeddings"])
    torch.manual_seed(SEED)
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        architectures=["BertForMaskedLM"], **shape)
    BertForMaskedLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
