"""Shared fixtures: real data from tests/data, tiny offline models saved and reloaded via from_pretrained, one Ray."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from fixture_data import STORIES, data_dir
from lm_eval.tasks import TaskManager
from offline_tasks import (
    wikitext_pages,
    write_mirror_tasks,
    write_pages,
    write_reference_tasks,
)

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# What lm-eval tasks write outside --output (the datasets cache, raylm's copy of lm-eval's task index) goes to a
# directory of this test session, shared by its xdist workers (they inherit it from the process that spawns them,
# which made it and removes it at exit) and their CLI subprocesses, so the index is built once per session.
if "RAYLM_TEST_SESSION_CACHE" in os.environ:
    _SESSION_CACHE = Path(os.environ["RAYLM_TEST_SESSION_CACHE"])
else:
    _SESSION_CACHE = Path(tempfile.mkdtemp(prefix="raylm-test-cache-"))
    os.environ["RAYLM_TEST_SESSION_CACHE"] = str(_SESSION_CACHE)
    atexit.register(shutil.rmtree, _SESSION_CACHE, True)
os.environ.setdefault("HF_DATASETS_CACHE", str(_SESSION_CACHE / "hf-datasets"))
os.environ.setdefault("RAYLM_CACHE_DIR", str(_SESSION_CACHE / "raylm"))

# The tests' data (tests/data, some of it compressed), unpacked once per session for the code that reads it.
DATA = data_dir()
GPT2_TOKENIZER = DATA / "models" / "gpt2-tokenizer"

# The test process scores in one torch thread. Its models are tiny (per-op overhead, not arithmetic), and it shares
# the cores with a second xdist worker and with Ray actors: two OpenMP threads per process then wait at every op's
# barrier for a thread the kernel has descheduled. Measured on stories260K WikiText rows under that load, one
# thread scored 4x faster than two.
torch.set_num_threads(1)

# The files whose tests take longest in all, first: pytest-xdist hands whole files to workers in collection order
# (under --no-loadscope-reorder; by default it sends the files with the most tests first), so with these first the
# run does not end on one worker finishing a long file while the others sit idle. From the per-file time of a full
# run (its tests' setup, call and teardown, `--durations=0`); a file not named (under 10 s) keeps its place after them.
LONGEST_FIRST = ("test_corpus.py", "test_contamination.py", "test_sweep.py", "test_job_submit.py", "test_resume.py", "test_stopping.py",
                 "test_lmeval_eval.py", "test_autoscaling.py", "test_storage_s3.py", "test_mlm_eval.py",
                 "test_cli.py", "test_golden.py", "test_fault_tolerance.py", "test_architectures.py",
                 "test_quantization.py", "test_generation_parity.py", "test_lmeval_names.py", "test_node_loss.py",
                 "test_generation_tasks.py", "test_code_tasks.py", "test_leaderboard.py", "test_report.py", "test_membership.py", "test_parity_golden.py",
                 "test_lmeval_golden.py", "test_bench_gpu_driver.py", "test_mlm_ppl.py", "test_eval_ray.py",
                 "test_fewshot.py", "test_cpus.py", "test_model_identity.py", "test_mlm_scoring.py",
                 "test_placement_timeout.py", "test_scoring.py", "test_generation_engine.py", "test_bad_input.py",
                 "test_lowp_lmeval.py", "test_placement.py", "test_import_race.py", "test_lmeval_results.py",
                 "test_prefix_scoring.py", "test_compare.py")


# The fast tier (`pytest -m "not slow"`, CONTRIBUTING.md) leaves out every test that needs a Ray: the session's (these
# fixtures, or any fixture built on them) or a head of its own (the `cluster` marker).
RAY_FIXTURES = {"ray_session", "ray_restarted_after"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.slow)


def tasks_only(include_path: Path) -> TaskManager:
    """lm-eval's TaskManager over the YAMLs in `include_path` alone. The task YAMLs the tests write include lm-eval's
    own by path, so they load as under its full index, which it builds from ~10k YAMLs in 5 s of CPU."""
    return TaskManager(include_path=str(include_path), include_defaults=False)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    """A seeded random GPT-2 with the real GPT-2 tokenizer and a 128-token context, so real rows get truncated
    and WikiText pages span several rolling windows."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(GPT2_TOKENIZER).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def local_tasks(tmp_path_factory) -> Path:
    """lm-eval's own task YAMLs with their data pointed at the offline mirror (arc_easy_local, boolq_local,
    piqa_local, mmlu_*_local and the mmlu_local groups), as a user passes them with --include-path."""
    out = tmp_path_factory.mktemp("local-tasks")
    write_mirror_tasks(DATA / "hf", out)
    return out


@pytest.fixture(scope="session")
def reference_tasks(tmp_path_factory) -> Path:
    """The lm-eval tasks the goldens' native numbers were made with (hellaswag_local, winogrande_local,
    wikitext_local on all of WikiText-2's test pages), as an --include-path."""
    out = tmp_path_factory.mktemp("reference-tasks")
    pages = write_pages(wikitext_pages(DATA / "wikitext-2" / "test.txt"), out / "pages.jsonl")
    return write_reference_tasks(DATA, pages, out)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A seeded random Llama (GQA, RoPE) on the stories260K tokenizer, 128-token context."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A seeded random 2-layer BertForMaskedLM on a 3000-piece WordPiece trained offline on the shared text
    (tests/masked_models.py), 128 positions."""
    from masked_models import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), DATA)


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory) -> Path:
    """A seeded random 2-layer RobertaForMaskedLM on the GPT-2 byte-level BPE laid out as RoBERTa's vocabulary,
    96 usable positions (max_position_embeddings 98, as roberta-base's 514 for 512)."""
    from masked_models import build_tiny_roberta

    return build_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"), GPT2_TOKENIZER)


def _start_ray():
    import ray

    from raylm.cluster.runtime import LOCAL_SYSTEM_CONFIG

    # Smaller than raylm's own local Ray, but with its worker settings, so actors run as they do for users.
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 * 1024**2,
             log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    return ray


@pytest.fixture(scope="session")
def ray_session():
    """One small local Ray for the whole test session; ray.init costs seconds here."""
    ray = _start_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_restarted_after(ray_session):
    """The session Ray, started afresh once the module is done.

    A Ray Data stream that ended in an error can leave its map actors alive (holding CPUs) for as long as the
    driver lives; a CLI run ends with its driver, but a test session's driver goes on, and later tests that
    start actors would wait for CPUs for ever.
    """
    yield ray_session
    restart_ray()


def restart_ray() -> None:
    """The session Ray shut down and started afresh: what a test that ends a stream in an error does before the
    next stream, whose actors would otherwise wait for the CPUs the failed stream's actors still hold."""
    import ray

    ray.shutdown()
    _start_ray()


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process (and so its own local Ray)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env_extra or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "raylm", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


@pytest.fixture(scope="session")
def truncated_weights_model(tiny_llama, tmp_path_factory) -> Path:
    """tiny_llama whose model.safetensors was cut short, as an interrupted download leaves it: the config and
    tokenizer load on the driver, so the error is raised inside the scoring actor."""
    path = tmp_path_factory.mktemp("truncated") / "model"
    shutil.copytree(tiny_llama, path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    return path


@pytest.fixture(scope="session")
def mismatched_weights_model(tiny_llama, tmp_path_factory) -> Path:
    """tiny_llama whose config was edited after its weights were saved (a narrower MLP): the weights' headers read
    on the driver, and the load fails inside the scoring actor."""
    path = tmp_path_factory.mktemp("mismatched") / "model"
    shutil.copytree(tiny_llama, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] // 2}))
    return path


@pytest.fixture(scope="session")
def pickle_only_model(tiny_llama, tmp_path_factory) -> Path:
    """tiny_llama with its weights as pytorch_model.bin (pickle) instead of safetensors."""
    import torch
    from safetensors.torch import load_file

    path = tmp_path_factory.mktemp("pickle-only") / "model"
    shutil.copytree(tiny_llama, path)
    torch.save(load_file(path / "model.safetensors"), path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    return path


def require_sandbox() -> None:
    """A test that runs generated programs in the sandbox: where this node cannot make one it skips, saying why,
    except where CI=true (.ci/run installs bubblewrap), where it fails."""
    from raylm.sandbox.bubblewrap import sandbox_unavailable

    reason = sandbox_unavailable()
    if reason is not None and os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required where CI=true)", pytrace=False)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def sandboxed() -> None:
    require_sandbox()
