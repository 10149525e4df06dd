"""Request tables kept between runs (raylm.requests.cache): read back equal to a fresh build, keyed to everything
that changes a request, and a damaged entry rebuilt with one warning, never read."""

from __future__ import annotations

import functools
import logging

import pytest
from conftest import GPT2_TOKENIZER, STORIES
from test_lmeval_requests import fake_built
from transformers import AutoTokenizer

from raylm.cache import CACHE_DIR_ENV, NO_CACHE_ENV
from raylm.requests.cache import TableCache
from raylm.requests.encoding import Encoder
from raylm.requests.lmeval import request_tables, task_metadata
from raylm.tasks.lmeval.build import Request, load_and_build
from raylm.tasks.lmeval.names import select

TEXT = "Once upon a time there was a little girl who lived in a village near the forest. " * 3
REQUESTS = [Request("story", 0, 0, "loglikelihood", (TEXT, " She")),
            Request("story", 0, 1, "loglikelihood", (TEXT, " He")),
            Request("story", 1, 0, "loglikelihood_rolling", (TEXT * 4,))]


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return tmp_path


@functools.cache
def tokenizer(path):
    return AutoTokenizer.from_pretrained(path)


def gpt2(max_length: int = 32) -> Encoder:
    return Encoder(tokenizer(GPT2_TOKENIZER), max_length)


def test_a_kept_table_is_read_back_equal_to_a_fresh_build_and_warns_as_it_did(cache_dir, caplog):
    encoder = gpt2()
    fresh = request_tables(fake_built({"story": REQUESTS}), encoder)["story"]
    cache = TableCache.for_encoder(encoder, "code")
    built = fake_built({"story": REQUESTS})
    metadata = task_metadata(built, "story")
    assert cache.get(REQUESTS, metadata) is None
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        first = request_tables(built, encoder, cache=cache)["story"]
        kept = cache.get(REQUESTS, metadata)
        assert kept is not None and kept[1] == 2  # both pairs are left-truncated to 32 tokens
        second = request_tables(built, encoder, cache=cache)["story"]
    assert first.equals(fresh, check_metadata=True) and second.equals(fresh, check_metadata=True)
    assert caplog.messages == ["story: 2 requests exceed the model's max length 32; their contexts are "
                               "left-truncated"] * 2


def test_anything_that_changes_a_request_is_a_miss(cache_dir):
    encoder = gpt2()
    built = fake_built({"story": REQUESTS})
    metadata = task_metadata(built, "story")
    table = request_tables(built, encoder, cache=TableCache.for_encoder(encoder, "code"))["story"]
    cache = TableCache.for_encoder(encoder, "code")
    assert cache.get(REQUESTS, metadata)[0].equals(table, check_metadata=True)
    other_text = [REQUESTS[0], Request("story", 0, 1, "loglikelihood", (TEXT, " It")), REQUESTS[2]]
    assert cache.get(other_text, metadata) is None  # another template, data file or few-shot draw
    assert cache.get(REQUESTS[:2], metadata) is None  # another limit
    assert cache.get(REQUESTS, {**metadata, b"raylm.lmeval.config": b"another"}) is None  # another task config
    assert TableCache.for_encoder(encoder, "changed").get(REQUESTS, metadata) is None  # raylm's request code
    assert TableCache.for_encoder(gpt2(64), "code").get(REQUESTS, metadata) is None  # max length
    stories = Encoder(tokenizer(STORIES), 32)
    assert TableCache.for_encoder(stories, "code").get(REQUESTS, metadata) is None  # another tokenizer
    assert not request_tables(built, stories)["story"].equals(table)


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_entry_is_rebuilt_with_one_warning_never_read(cache_dir, caplog, damage):
    encoder = gpt2()
    built = fake_built({"story": REQUESTS})
    cache = TableCache.for_encoder(encoder, "code")
    fresh = request_tables(built, encoder, cache=cache)["story"]
    path = cache.path(REQUESTS, task_metadata(built, "story"))
    data = bytearray(path.read_bytes())
    path.write_bytes(data[:len(data) // 2] if damage == "truncated" else data[:100] + bytes([data[100] ^ 1])
                     + data[101:])
    with caplog.at_level(logging.WARNING, logger="raylm.requests.cache"):
        again = request_tables(built, encoder, cache=cache)["story"]
    assert again.equals(fresh, check_metadata=True)
    assert [r.message for r in caplog.records if r.name == "raylm.requests.cache"] == [
        f"request cache entry {path} is damaged (its SHA-256 does not match); building the requests again"]
    assert cache.get(REQUESTS, task_metadata(built, "story"))[0].equals(fresh, check_metadata=True)  # rewritten


def test_the_cache_is_off_with_raylms_cache(monkeypatch):
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert TableCache.for_encoder(gpt2(), "code") is None


def test_lm_evals_template_and_few_shot_seed_change_the_key_and_a_rebuild_hits(cache_dir, local_tasks, tmp_path):
    """Real lm-eval tasks: the same build again is read back equal; another doc_to_text or few-shot seed is not."""
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "arc_other_prompt.yaml").write_text(
        f"task: arc_other_prompt\ninclude: {local_tasks / 'arc_easy_local.yaml'}\ntag: null\n"
        "doc_to_text: \"Q: {{question}}\\nA:\"\n")
    encoder = gpt2(128)
    cache = TableCache.for_encoder(encoder, "code")

    def build(task: str, include, fewshot_seed: int):
        built = load_and_build(select([task], include), (0, 1234, 1234, fewshot_seed), 1, 3)
        return built.requests(task), task_metadata(built, task), request_tables(built, encoder, cache=cache)[task]

    requests, metadata, table = build("arc_easy_local", local_tasks, 1234)
    again = build("arc_easy_local", local_tasks, 1234)
    assert again[0] == requests and again[2].equals(table, check_metadata=True)
    reseeded = build("arc_easy_local", local_tasks, 7)
    assert reseeded[0] != requests and not reseeded[2].equals(table)
    other = build("arc_other_prompt", variant, 1234)
    assert other[1] != metadata and not other[2].equals(table)
    assert len(list(cache.directory.iterdir())) == 3
