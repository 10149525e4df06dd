"""Where raylm keeps what it computes once and reuses between runs (lm-eval's task index, weight-file digests,
lm-eval tasks' tokenised request tables).

Everything kept here can be rebuilt from its inputs, so the directory may be deleted at any time. `RAYLM_NO_CACHE=1`
turns it off; `RAYLM_CACHE_DIR` moves it (default `$XDG_CACHE_HOME/raylm`, else `~/.cache/raylm`).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "RAYLM_CACHE_DIR"
NO_CACHE_ENV = "RAYLM_NO_CACHE"


def cache_dir() -> Path | None:
    """raylm's cache directory, or None when the cache is turned off."""
    if os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0"):
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "raylm"
