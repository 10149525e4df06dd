"""Deprecated: the Python API's home before raylm.api, kept so that `from raylm.lm_eval import RayLM` in an old
script still runs, with a DeprecationWarning that names the stable spelling, `from raylm import RayLM`.

A module file is the plainest way to keep an old import path working: the alternatives (a `sys.modules` entry or
an import hook planted by `import raylm`) would run on every import of raylm for the sake of a name nobody should
write, and hide where `raylm.lm_eval` comes from. Delete this file when the old spelling's grace period ends.
"""

from __future__ import annotations

import warnings

from raylm.api import RayLM

__all__ = ["RayLM"]

# stacklevel 2 names the importing line: warnings skips the import machinery's own frames.
warnings.warn("raylm.lm_eval is deprecated; use `from raylm import RayLM`", DeprecationWarning, stacklevel=2)
