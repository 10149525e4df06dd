"""The built-in demo: the packaged stories260K Llama and data samples (licences in raylm/demo/NOTICE.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEMO = Path(str(resources.files("raylm") / "demo"))
DEMO_MODEL = DEMO / "models" / "stories260K-hf"
DEMO_DATA = DEMO / "data"
