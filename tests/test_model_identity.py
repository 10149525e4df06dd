"""Which weights a run scores: hub ids pinned to a commit (offline from the cache's refs, online from the hub),
local weights fingerprinted by every byte of their contents rather than modification times, each file's hash kept
in raylm's cache until the file changes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import DATA, run_cli

from raylm.errors import RaylmError
from raylm.cache import CACHE_DIR_ENV, NO_CACHE_ENV
from raylm.models import identity
from raylm.models.checkpoint_size import stored_parameters
from raylm.models.identity import file_digest, model_digest, pin_revision
from raylm.models.spec import ModelSpec

REPO = "raylm-test/tiny"
SHA_1, SHA_2 = "1" * 40, "2" * 40


@pytest.fixture(scope="module")
def hub_cache(tiny_llama, tmp_path_factory) -> Path:
    """A Hugging Face cache as a download leaves it: two commits of REPO (different weights), main at the first,
    tag v1 at the second."""
    from safetensors.torch import load_file, save_file

    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / f"models--{REPO.replace('/', '--')}"
    for sha in (SHA_1, SHA_2):
        shutil.copytree(tiny_llama, repo / "snapshots" / sha)
    weights = repo / "snapshots" / SHA_2 / "model.safetensors"
    save_file({k: v + 0.5 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA_1)
    (repo / "refs" / "v1").write_text(SHA_2)
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch) -> Path:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return hub_cache / f"models--{REPO.replace('/', '--')}"


def test_offline_a_hub_id_is_pinned_to_the_cached_commit_and_a_moved_main_changes_the_fingerprint(offline):
    pinned = replace(pin_revision(ModelSpec(REPO)), scorer="causal")  # as the driver scores it
    assert pinned.revision == SHA_1 and model_digest(pinned) == f"hub:{REPO}@{SHA_1}"
    assert pin_revision(ModelSpec(REPO, revision="v1")).revision == SHA_2
    assert pin_revision(pinned) == pinned
    (offline / "refs" / "main").write_text(SHA_2)
    try:
        moved = pin_revision(ModelSpec(REPO))
    finally:
        (offline / "refs" / "main").write_text(SHA_1)
    assert moved.revision == SHA_2 and model_digest(moved) != model_digest(pinned)


def test_a_hub_models_parameters_are_counted_from_the_cached_commits_headers(offline, tiny_llama):
    """A pinned hub id is counted from the safetensors file the cache holds at its commit; one whose weights the
    cache does not hold (the driver downloads only the config and tokenizer) is left to the config's count."""
    from safetensors.numpy import load_file

    count = sum(v.size for v in load_file(tiny_llama / "model.safetensors").values())
    assert stored_parameters(pin_revision(ModelSpec(REPO))) == count
    weights = offline / "snapshots" / SHA_1 / "model.safetensors"
    weights.rename(weights.with_suffix(".away"))
    try:
        assert stored_parameters(pin_revision(ModelSpec(REPO))) is None
    finally:
        weights.with_suffix(".away").rename(weights)


def test_offline_a_model_missing_from_the_cache_is_one_line(offline):
    with pytest.raises(RaylmError) as err:
        pin_revision(ModelSpec("raylm-test/absent"))
    assert "HF_HUB_OFFLINE is set" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RaylmError, match="revision 'no-such-branch'"):
        pin_revision(ModelSpec(REPO, revision="no-such-branch"))


def test_online_the_hub_is_asked_and_an_unreachable_hub_falls_back_to_the_cache(offline, monkeypatch, caplog):
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    asked = []

    def answered(self, repo_id, revision=None):
        asked.append((repo_id, revision))
        return SimpleNamespace(sha="a" * 40)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", answered)
    assert pin_revision(ModelSpec(REPO, revision="dev")).revision == "a" * 40 and asked == [(REPO, "dev")]

    def unreachable(self, repo_id, revision=None):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with caplog.at_level(logging.WARNING):
        assert pin_revision(ModelSpec(REPO)).revision == SHA_1
    assert "Name or service not known" in caplog.text and SHA_1 in caplog.text
    with pytest.raises(RaylmError, match=r"the hub could not be asked \(ConnectionError: Name or service"):
        pin_revision(ModelSpec("raylm-test/absent"))


def test_local_weights_are_fingerprinted_by_contents_not_modification_times(tiny_llama, tmp_path):
    spec = ModelSpec(str(tiny_llama))
    before = model_digest(spec)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy, copy_function=shutil.copyfile)  # new files, new modification times
    os.utime(copy / "model.safetensors", (1, 1))
    assert model_digest(ModelSpec(str(copy))) == before
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_digest(ModelSpec(str(copy))) != before


def old_sampled_digest(path: Path, blocks: int = 16, block: int = 64 * 1024) -> str:
    """The scheme file_digest replaced: the size plus 16 evenly spaced 64 KiB blocks."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}\0".encode())
    with open(path, "rb") as f:
        for i in range(blocks):
            f.seek((size - block) * i // (blocks - 1))
            digest.update(f.read(block))
    return digest.hexdigest()


def test_a_byte_the_old_sampler_never_read_changes_the_fingerprint(tmp_path):
    """A fine-tune of the last layers or one merged LoRA projection changes bytes between the sampled blocks."""
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    size = 64 * 64 * 1024
    data = bytearray(os.urandom(size))
    weights.write_bytes(bytes(data))
    spec = ModelSpec(str(model))
    before_new, before_old = model_digest(spec), old_sampled_digest(weights)
    offset = (size - 64 * 1024) * 3 // 15 + 100 * 1024  # past the 4th sampled block, short of the 5th
    data[offset] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert old_sampled_digest(weights) == before_old  # what the old fingerprint missed
    assert model_digest(spec) != before_new


def test_a_files_digest_is_kept_outside_the_model_and_redone_when_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(os.urandom(3 * 1024 * 1024))
    reads = []
    real_hash = identity._hash_file
    monkeypatch.setattr(identity, "_hash_file", lambda path, size: reads.append(path.name) or real_hash(path, size))
    first = file_digest(weights)
    assert first == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert file_digest(weights) == first and reads == ["model.safetensors"]  # the second run reads the cache
    assert sorted(p.name for p in model.iterdir()) == ["model.safetensors"]
    assert len(list((tmp_path / "cache" / identity.DIGEST_DIR).glob("*.json"))) == 1
    # One byte changed in place, same size, modification time set back: the ctime still moves.
    stat = weights.stat()
    with open(weights, "r+b") as f:
        f.seek(1234567)
        byte = f.read(1)
        f.seek(1234567)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns and weights.stat().st_size == stat.st_size
    changed = file_digest(weights)
    assert changed != first and changed == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert reads == ["model.safetensors"] * 2
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert file_digest(weights) == changed and len(reads) == 3


@pytest.mark.slow  # a Ray of its own
def test_cli_on_a_cached_hub_model_offline_records_the_commit_it_scored(hub_cache, offline, tmp_path):
    """What a user with HF_HUB_OFFLINE=1 and a cached model runs: the commit main points to is loaded, recorded in
    results.json and fingerprinted in the checkpoint; once main moves, the model part of the fingerprint differs,
    so a rerun is refused rather than resumed."""
    out = tmp_path / "out"
    env = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    proc = run_cli("eval", "--model", REPO, "--tasks", "winogrande", "--limit", "2", "--data-dir", str(DATA),
                   "--output", str(out), "--no-progress", env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["model_commit"] == SHA_1 and "revision" not in config["model_args"]  # as asked: none
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert manifest["model"]["revision"] == SHA_1 and manifest["model"]["files"] == f"hub:{REPO}@{SHA_1}"
    pinned = replace(pin_revision(ModelSpec(REPO)), scorer="causal")  # as the driver scores it
    assert {**pinned.as_dict(), "files": model_digest(pinned)} == manifest["model"]
    (offline / "refs" / "main").write_text(SHA_2)
    try:
        moved = pin_revision(ModelSpec(REPO))
    finally:
        (offline / "refs" / "main").write_text(SHA_1)
    assert {**moved.as_dict(), "files": model_digest(moved)} != manifest["model"]


def test_the_python_api_pins_one_commit_for_its_tokenizer_its_actors_and_their_replacements(offline, monkeypatch):
    """RayLM's actors start as the object is made, replacements whenever one dies: all from one recipe, whose
    spec must name the commit `main` pointed to at the start, as the driver's tokenizer does."""
    import raylm.api
    from raylm.cluster.runtime import ActorRecipe

    monkeypatch.setattr(raylm.api, "connect", lambda **kwargs: None)
    monkeypatch.setattr(raylm.api, "plan_actors", lambda spec, *args: (ActorRecipe(spec, None, 1.0, 0.0, 1), 1))
    monkeypatch.setattr(raylm.api, "LaunchedActors", lambda recipe, n: SimpleNamespace(recipe=recipe))
    loaded = []
    real_load = raylm.api.load_tokenizer
    monkeypatch.setattr(raylm.api, "load_tokenizer", lambda spec: loaded.append(spec.revision) or real_load(spec))
    lm = raylm.api.RayLM(pretrained=REPO, device="cpu")
    assert loaded == [SHA_1] and lm.spec.revision == SHA_1
    (offline / "refs" / "main").write_text(SHA_2)  # main moves while the object lives
    try:
        assert lm._launched.recipe.spec.revision == SHA_1
    finally:
        (offline / "refs" / "main").write_text(SHA_1)
    assert lm.get_model_info() == {"model_dtype": "auto", "model_sha": SHA_1}
