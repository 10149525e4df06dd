"""Reading benchmark rows from local JSONL/text files or the Hugging Face hub, keeping where each row came from.

Every row carries its source and 1-based row number so that any later validation error can point the user at
the exact line to fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raylm.errors import InputError


@dataclass(frozen=True)
class Row:
    source: str
    number: int
    data: dict[str, Any]

    def get(self, name: str, kind: type | tuple[type, ...]) -> Any:
        """Return field `name`, refusing a missing field or a wrong type with a message naming file, row, field."""
        if name not in self.data or self.data[name] is None:
            raise InputError(self.source, "missing field", self.number, name)
        value = self.data[name]
        if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
            raise InputError(self.source, f"expected {_kind_name(kind)}, got {type(value).__name__}", self.number, name)
        return value

    def fail(self, message: str, name: str | None = None) -> InputError:
        return InputError(self.source, message, self.number, name)

    def content_key(self) -> str:
        """The row's fields as canonical JSON: two rows are the same document exactly when their keys are equal,
        which is how lm-eval's few-shot sampler tells the evaluated document among drawn examples (dict ==)."""
        return json.dumps(self.data, sort_keys=True, ensure_ascii=False, default=str)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


def read_text_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file with their newlines, naming the first line that is not UTF-8."""
    _require_file(path)
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise InputError(str(path), f"not valid UTF-8 (byte {e.start})", number) from None
    if not any(line.strip() for line in lines):
        raise InputError(str(path), "data file is empty")
    return lines


def read_jsonl(path: Path) -> list[Row]:
    rows = []
    for number, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(str(path), f"malformed JSON ({e.msg})", number) from None
        if not isinstance(obj, dict):
            raise InputError(str(path), "expected a JSON object", number)
        rows.append(Row(str(path), number, obj))
    return rows


def read_hub(path: str, name: str | None, split: str) -> list[Row]:
    """Rows of a hub dataset split, loaded the way lm-evaluation-harness loads it (needs network or HF cache)."""
    import datasets

    try:
        ds = datasets.load_dataset(path, name, split=split)
    except Exception as e:  # noqa: BLE001 - re-raised as a one-line user error with the cause kept
        raise InputError(f"hub:{path}", f"could not load split '{split}' ({type(e).__name__}: {e}); "
                         "use --data-dir for local files") from e
    return [Row(f"hub:{path}/{split}", i + 1, dict(r)) for i, r in enumerate(ds)]


def _require_file(path: Path) -> None:
    if not path.exists():
        raise InputError(str(path), "data file not found")
    if not path.is_file():
        raise InputError(str(path), "not a file")
