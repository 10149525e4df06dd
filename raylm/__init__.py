"""raylm: lm-evaluation-harness-compatible loglikelihood evaluation, scored by model-resident Ray actors.

The public names live here, so that a script's imports survive raylm moving its modules: `from raylm import RayLM`
(lm-eval's Python API on raylm's actors; raylm.api) and `raylm.__version__`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylm.api import RayLM

__version__ = "0.1.0"
__all__ = ["RayLM", "__version__"]


def __getattr__(name: str) -> Any:
    """RayLM is imported on first use: raylm.api pulls in lm-eval, torch and Ray, and `import raylm` (every command,
    every actor, every module that reads `raylm.__version__`) must not pay for them."""
    if name == "RayLM":
        from raylm.api import RayLM

        globals()["RayLM"] = RayLM
        return RayLM
    raise AttributeError(f"module 'raylm' has no attribute {name!r}")
