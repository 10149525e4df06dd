"""Tiny masked LMs for the tests, built offline: seeded random weights on real tokenizers.

- BERT: a lower-cased WordPiece vocabulary trained here with `tokenizers` on the shared HellaSwag, WinoGrande and
  WikiText text (BERT's normaliser and pre-tokeniser), small enough that many words split into several pieces,
  which is what word-l2r is about.
- RoBERTa: the real GPT-2 byte-level BPE with ids laid out as RoBERTa's own (<s> <pad> </s> <unk> first, so the
  pad id is 1: RoBERTa numbers positions from padding_idx + 1), <mask> last and swallowing the space before it,
  as roberta-base's does; max_position_embeddings is the usable length + 2, RoBERTa's 514 for 512.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_HEAD = ["<s>", "<pad>", "</s>", "<unk>"]


def shared_text(data: Path) -> Iterator[str]:
    for line in (data / "hellaswag" / "validation.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        yield row["activity_label"] + ": " + row["ctx"]
        yield from row["endings"]
    for line in (data / "winogrande" / "dev.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        yield row["sentence"].replace("_", row["option1"])
    yield from (line for line in (data / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
                if line.strip())


def bert_tokenizer(data: Path, vocab_size: int, max_length: int):
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast

    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(shared_text(data), trainers.WordPieceTrainer(vocab_size=vocab_size,
                                                                         special_tokens=BERT_SPECIALS))
    vocab = tok.get_vocab()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return BertTokenizerFast(vocab=vocab, tokenizer_object=tok, do_lower_case=True, model_max_length=max_length)


def build_tiny_bert(path: Path, data: Path, seed: int = 0, max_length: int = 128) -> Path:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tokenizer = bert_tokenizer(data, 3000, max_length)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=max_length,
                        pad_token_id=tokenizer.pad_token_id, architectures=["BertForMaskedLM"])
    BertForMaskedLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_roberta(path: Path, gpt2_tokenizer: Path, seed: int = 0, max_length: int = 96) -> Path:
    import torch
    from tokenizers import AddedToken
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizer

    gpt2 = json.loads((gpt2_tokenizer / "vocab.json").read_text(encoding="utf-8"))
    vocab = {t: i for i, t in enumerate(ROBERTA_HEAD)}
    for token, _ in sorted(gpt2.items(), key=lambda kv: kv[1]):
        vocab[token] = len(vocab)
    vocab["<mask>"] = len(vocab)
    merges = [tuple(m.split(" ")) for m in (gpt2_tokenizer / "merges.txt").read_text(encoding="utf-8").splitlines()
              if m and not m.startswith("#version")]
    mask = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
    tokenizer = RobertaTokenizer(vocab=vocab, merges=merges, mask_token=mask, model_max_length=max_length)
    torch.manual_seed(seed)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=max_length + 2,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id, type_vocab_size=1,
                           architectures=["RobertaForMaskedLM"])
    RobertaForMaskedLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
