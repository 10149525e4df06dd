"""Run by tests/test_import_race.py, in a process of its own since it drops transformers from sys.modules: what
`raylm eval`'s driver would do on two threads at once, over a freshly imported transformers each try. One thread
loads the tokenizer and config (the tokenising thread) while another imports the scoring code (as the parameter
count's import of transformers' modeling code would). In raylm's order (`pre-import`) the driver imports torch
and transformers (raylm.cluster.runtime.import_transformers) before either starts; in the other (`none`) both
start at once. Prints, per order, the failed tries and the first failure.

Usage: python import_race.py MODEL_DIR PRE_IMPORT_TRIES NONE_TRIES (the `none` order stops at its first failure:
how often the race is won depends on the machine's load, and one failure is the proof)
"""

from __future__ import annotations

import json
import sys
import threading
from importlib import import_module

import torch  # noqa: F401  (torch cannot be imported twice in one process, so it stays)

from raylm.cluster.runtime import import_transformers
from raylm.models.loading import load_config, load_tokenizer
from raylm.models.spec import ModelSpec


def forget_transformers() -> None:
    """transformers, and raylm's modules that hold its names, as if never imported; but for transformers.utils,
    which caches the index of transformers' modules that its first import builds (seconds)."""
    for name in list(sys.modules):
        if (name.partition(".")[0] == "transformers" and not name.startswith("transformers.utils")
                or name == "raylm.cluster.actors" or name.startswith("raylm.scoring")):
            del sys.modules[name]


def one_try(spec: ModelSpec, pre_import: bool) -> list[str]:
    forget_transformers()
    if pre_import:
        import_transformers()
    errors: list[str] = []
    started = threading.Event()

    def tokenise() -> None:
        started.set()
        try:
            load_tokenizer(spec)
            load_config(spec)
        except Exception as e:  # counted, and shown by the test
            errors.append(f"tokenising thread: {e!r}")

    thread = threading.Thread(target=tokenise)
    thread.start()
    started.wait()
    try:
        import_module("raylm.cluster.actors")
    except Exception as e:  # counted, and shown by the test
        errors.append(f"driver: {e!r}")
    thread.join()
    return errors


def main() -> None:
    spec = ModelSpec(sys.argv[1], device="cpu")
    out = {}
    for order, tries in (("pre-import", int(sys.argv[2])), ("none", int(sys.argv[3]))):
        failed = []
        for _ in range(tries):
            errors = one_try(spec, order == "pre-import")
            if errors:
                failed.append(errors)
                if order == "none":
                    break
        out[order] = {"failures": len(failed), "first": failed[0][0] if failed else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
