"""What the low-precision goldens (tests/goldens/lmeval_lowp.json) are keyed by, shared by the test that reads them
and the script that makes them (tests/goldens/make_lmeval_lowp.py): which weights, which requests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

import tiny_families as fam
from fixture_data import STORIES

GOLDEN = Path(__file__).resolve().parent / "goldens" / "lmeval_lowp.json"
TASKS = ("hellaswag", "winogrande")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every tensor of the state dict, by name, as float32 bytes: the same for the same weights whatever
    file format, dtype they were saved in or transformers version wrote them."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def requests_digest(pairs: list[list[list[str]]]) -> str:
    """sha256 of the (context, continuation) strings of every document's requests, in order."""
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def model_dir(name: str, root: Path) -> Path:
    """`stories260K` is the shared golden model; `tiny:<family>` is the architecture matrix's seed-0 model of the
    family (tests/tiny_families.py) with the stories tokenizer, built under `root`."""
    if name == "stories260K":
        return STORIES
    from transformers import AutoTokenizer

    family = name.removeprefix("tiny:")
    path = root / f"{family}-s0"
    if not path.exists():
        fam.build(family, root)
        AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path
