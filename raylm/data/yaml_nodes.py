"""YAML files (sweep files, probe files) read as nodes, so that every error names the file, line and key.

Values are built with yaml's safe constructor only, one node at a time, so each still knows the line it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from raylm.errors import RaylmError


def compose_file(path: Path, what: str) -> yaml.Node | None:
    """The file's root node (None for an empty file); unreadable files and bad YAML are one-line errors."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RaylmError(f"{path}: cannot read {what}: {e.strerror}") from e
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise RaylmError(f"{path}: {line}not valid YAML: {getattr(e, 'problem', e)}") from e


def read_top(path: Path, what: str, allowed: tuple[str, ...], required: tuple[str, ...]
             ) -> tuple[NodeReader, dict[str, yaml.Node]]:
    """A YAML file's reader and its top-level mapping, checked: not empty, only `allowed` keys, every `required`
    key present."""
    root = compose_file(path, what)
    r = NodeReader(path)
    needs = " and ".join(f"'{key}'" for key in required)
    if root is None:
        raise RaylmError(f"{path}: line 1: the {what} is empty (it needs {needs})")
    top = r.mapping(root, "", allowed)
    for key in required:
        if key not in top:
            raise r.fail(root, key, f"missing (a {what} needs {needs})")
    return r, top


class NodeReader:
    """Turns nodes into checked values; every failure names the file, the node's line and the key path."""

    def __init__(self, source: Path):
        self.source = source

    def fail(self, node: yaml.Node, key: str, message: str) -> RaylmError:
        return RaylmError(f"{self.source}: line {node.start_mark.line + 1}: {key}: {message}")

    def mapping(self, node: yaml.Node, key: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "must be a mapping")
        out: dict[str, yaml.Node] = {}
        for k, v in node.value:
            name = self.scalar(k, key)
            where = f"{key}.{name}" if key else str(name)
            if name not in allowed:
                raise self.fail(k, where, f"unknown key (allowed: {', '.join(allowed)})")
            if name in out:
                raise self.fail(k, where, "given twice")
            out[name] = v
        return out

    def scalar(self, node: yaml.Node, key: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, "must be a single value")
        return yaml.constructor.SafeConstructor().construct_object(node)

    def values(self, node: yaml.Node, key: str) -> list[tuple[yaml.Node, Any]]:
        """A scalar or a list of scalars, each with its node (so errors point at the offending item)."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            raise self.fail(node, key, "must not be empty")
        return [(item, self.scalar(item, key)) for item in items]

    def checked(self, node: yaml.Node, key: str, check: Callable[[Any], None], value: Any) -> Any:
        """`value`, after `check` (which raises a RaylmError) passed it; the error names this node's line."""
        try:
            check(value)
        except RaylmError as e:
            raise self.fail(node, key, str(e)) from e
        return value

    def typed(self, node: yaml.Node, key: str, kind: type | tuple[type, ...], what: str) -> Any:
        value = self.scalar(node, key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
            raise self.fail(node, key, f"must be {what}, got {value!r}")
        return value
