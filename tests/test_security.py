"""Safe defaults: no remote code, no pickle weights, no unsafe YAML, Ray's token authentication left alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import raylm
from raylm.cli import build_parser, config_from_args
from raylm.errors import RaylmError
from raylm.models.loading import load_model
from raylm.models.spec import ModelSpec, check_model_path
from raylm.storage.location import redact

SOURCES = sorted(Path(raylm.__file__).parent.rglob("*.py"))


def spec_from(*args: str) -> ModelSpec:
    return config_from_args(build_parser().parse_args(["eval", "--model", "some/model", *args])).model


def test_remote_code_and_pickle_are_opt_in():
    assert not spec_from().trust_remote_code and not spec_from().allow_pickle
    assert spec_from("--trust-remote-code").trust_remote_code
    assert spec_from("--allow-pickle").allow_pickle


def test_pickle_weights_load_only_with_the_flag(pickle_only_model):
    with pytest.raises(RaylmError, match="pass --allow-pickle if you trust them"):
        check_model_path(ModelSpec(str(pickle_only_model)))
    # Even past the driver's check, the loader itself will not unpickle without the flag.
    with pytest.raises(RaylmError, match="could not load model"):
        load_model(ModelSpec(str(pickle_only_model), device="cpu"))
    model = load_model(ModelSpec(str(pickle_only_model), device="cpu", allow_pickle=True))
    assert isinstance(next(model.parameters()), torch.Tensor)


def test_safetensors_are_preferred_when_both_exist(tiny_llama, pickle_only_model, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    for path in [*tiny_llama.iterdir(), pickle_only_model / "pytorch_model.bin"]:
        (both / path.name).write_bytes(path.read_bytes())
    (both / "pytorch_model.bin").write_bytes(b"not a pickle: loading it would fail")
    check_model_path(ModelSpec(str(both)))
    for allow_pickle in (False, True):
        load_model(ModelSpec(str(both), device="cpu", allow_pickle=allow_pickle))


UNSAFE = [r"yaml\.load\(", r"yaml\.unsafe_load", r"yaml\.full_load", r"Loader=yaml\.(Unsafe|Full)?Loader\b",
          r"RAY_AUTH_MODE", r"torch\.load\(", r"pickle\.loads?\("]


@pytest.mark.parametrize("unsafe", UNSAFE)
def test_source_has_no_unsafe_calls(unsafe):
    offenders = [str(p) for p in SOURCES if re.search(unsafe, p.read_text())]
    assert SOURCES and offenders == []


@pytest.mark.parametrize(("text", "shown"), [
    ("s3://AKID:secret@bucket/run", "s3://***@bucket/run"),
    ("s3://AKID:sec/ret+x@bucket/run?region=eu-west-1", "s3://***@bucket/run?region=eu-west-1"),  # '/' unescaped
    ("raylm eval --output=gs://user:pw@bucket/run --limit 3", "raylm eval --output=gs://***@bucket/run --limit 3"),
    ("abfs://account:KEY@container/run", "abfs://***@container/run"),
    ("abfs://container@account.dfs.core.windows.net/run", "abfs://container@account.dfs.core.windows.net/run"),
    ("sftp://me@host/run", "sftp://me@host/run"),  # a user name alone is no secret
    ("az://c/run?sas_token=sv%3D2024&sig=abc&timeout=5", "az://c/run?sas_token=***&sig=***&timeout=5"),
    ("s3://bucket/run@v2", "s3://bucket/run@v2"),
    ("/data/a:b@c", "/data/a:b@c"),
])
def test_secrets_in_uris_are_redacted_and_nothing_else(text, shown):
    assert redact(text) == shown
