"""Run the script that made the golden values (tests/golden/make_stories260K.py) unchanged except for HFLM's dtype.

The script pins `dtype=float32` in the model_args it passes to lm_eval.simple_evaluate. To get lm-eval's
own numbers at bfloat16 or float16 from the very same task files, preprocessing and sample logging, this runs the
script as it is with simple_evaluate wrapped so that only that one model argument changes (and the dtype is added
to what the script writes, so an output file says what made it).

    python bench/lmeval_at_dtype.py bfloat16 tests/golden/make_stories260K.py MODEL \
        hellaswag_local,winogrande_local OUT.json --limit 40
"""

from __future__ import annotations

import json
import runpy
import sys

DTYPES = ("float32", "bfloat16", "float16")
PINNED = "dtype=float32"


def with_dtype(model_args: str, dtype: str) -> str:
    """The script's model_args with its pinned float32 replaced; refuses args that do not pin it (the script
    changed, and this wrapper would silently run another dtype)."""
    if model_args.split(",").count(PINNED) != 1:
        raise SystemExit(f"expected the script's model_args to pin {PINNED}, got {model_args!r}")
    return ",".join(f"dtype={dtype}" if arg == PINNED else arg for arg in model_args.split(","))


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in DTYPES:
        raise SystemExit(f"usage: lmeval_at_dtype.py {{{','.join(DTYPES)}}} SCRIPT [SCRIPT ARGS...]")
    dtype, script, args = argv[0], argv[1], argv[2:]
    import lm_eval

    evaluate = lm_eval.simple_evaluate

    def simple_evaluate(*a, model_args: str, **kw):
        return evaluate(*a, model_args=with_dtype(model_args, dtype), **kw)

    lm_eval.simple_evaluate = simple_evaluate
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    out = args[2]  # both scripts take MODEL TASKS OUT first
    written = json.loads(open(out).read())
    written["dtype"] = dtype
    with open(out, "w") as f:
        json.dump(written, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
