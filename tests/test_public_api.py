"""Public names have one stable home: `from raylm import RayLM`, and `import raylm` stays cheap. The class's module
(`raylm.api`) and its earlier home (`raylm.lm_eval`, deprecated) give the same class, so old scripts keep running."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_raylm_loads_no_heavy_library():
    """Every command, actor and module that reads raylm.__version__ imports raylm: RayLM must wait for its use."""
    probe = ("import sys, raylm\n"
             "assert raylm.__version__\n"
             "print(sorted(m for m in ('lm_eval', 'ray', 'torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", (proc.stdout, proc.stderr[-2000:])


def test_the_three_spellings_give_one_class():
    import raylm
    from raylm import RayLM
    from raylm.api import RayLM as in_api

    sys.modules.pop("raylm.lm_eval", None)  # the old spelling warns when its module is first imported
    with pytest.warns(DeprecationWarning, match="use `from raylm import RayLM`") as record:
        from raylm.lm_eval import RayLM as old
    assert RayLM is in_api is old is raylm.RayLM
    # attributed to the importing line, so that Python shows it when that line is in a script (__main__)
    assert [w.filename for w in record if "raylm.lm_eval" in str(w.message)] == [__file__]
    assert not hasattr(raylm, "Nothing")

