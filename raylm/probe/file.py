"""Probe files (probes.yaml): matched templates, the words filled into them, and the target words to compare.

    templates:                       # each has exactly one mask: [MASK], or the model's own mask token
      - "The {occupation} said [MASK] was tired."
      - "The {occupation} told us that [MASK] would be late."
    fill:                            # {placeholder}: values; a template runs once per combination it uses
      occupation: [nurse, engineer, teacher]
    targets: [he, she, they]         # one-token words; log-ratios are taken against the first

What can be checked without a model (shape, empty lists, placeholders) is checked here; a template's mask (which
may be the model's own spelling) and each target being one token where the mask is need the tokenizer
(raylm.probe.sentences). Every error names the file, line and key.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from raylm.data.yaml_nodes import NodeReader, read_top
from raylm.errors import RaylmError

KEYS = ("templates", "fill", "targets")
GENERIC_MASK = "[MASK]"  # what a probe file or --text may write for the model's own mask token


@dataclass(frozen=True)
class Located:
    """A string from the probe file and where it was: errors found later (with the tokenizer) can name it."""

    text: str
    line: int
    key: str


@dataclass(frozen=True)
class ProbeFile:
    source: Path
    templates: tuple[Located, ...]
    fill: dict[str, tuple[Located, ...]]
    targets: tuple[Located, ...]

    def fail(self, where: Located, message: str) -> RaylmError:
        return RaylmError(f"{self.source}: line {where.line}: {where.key}: {message}")


def load_probes(path: Path) -> ProbeFile:
    r, top = read_top(path, "probe file", KEYS, ("templates", "targets"))
    fill = {}
    if "fill" in top:
        node = top["fill"]
        if not isinstance(node, yaml.MappingNode) or not node.value:
            raise r.fail(node, "fill", "must be a non-empty mapping of placeholder: [values]")
        for key_node, values in node.value:
            name = r.typed(key_node, "fill", str, "a placeholder name")
            if not name.isidentifier():
                raise r.fail(key_node, f"fill.{name}", "a placeholder name must be a Python identifier")
            if name in fill:
                raise r.fail(key_node, f"fill.{name}", "given twice")
            fill[name] = _strings(r, values, f"fill.{name}")
    probes = ProbeFile(path, _strings(r, top["templates"], "templates"), fill, _strings(r, top["targets"], "targets"))
    used: set[str] = set()
    for template in probes.templates:
        names = placeholders(probes, template)
        unknown = sorted(names - set(fill))
        if unknown:
            raise probes.fail(template, f"uses {{{unknown[0]}}}, which 'fill' does not define")
        used |= names
    for name, values in fill.items():
        if name not in used:
            raise probes.fail(values[0], f"no template uses {{{name}}}")
    if len(probes.targets) < 2:
        raise probes.fail(probes.targets[0], "needs at least two targets to compare")
    _unique(probes, probes.targets)
    return probes


def placeholders(probes: ProbeFile, template: Located) -> set[str]:
    """The {names} a template uses; literal braces are written {{ and }}."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template.text) if f is not None]
    except ValueError as e:
        raise probes.fail(template, f"{e} (write literal braces as {{{{ and }}}})") from e
    for field in fields:
        if not field.isidentifier():
            raise probes.fail(template, f"{{{field}}} is not a placeholder name (write literal braces as {{{{ }}}})")
    return set(fields)


def _strings(r: NodeReader, node: yaml.Node, key: str) -> tuple[Located, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise r.fail(node, key, "must be a list")
    if not node.value:
        raise r.fail(node, key, "must not be empty")
    out = []
    for i, item in enumerate(node.value):
        value = r.typed(item, f"{key}[{i}]", str, "a string")
        if not value.strip():
            raise r.fail(item, f"{key}[{i}]", "must not be blank")
        out.append(Located(value, item.start_mark.line + 1, f"{key}[{i}]"))
    return tuple(out)


def _unique(probes: ProbeFile, items: tuple[Located, ...]) -> None:
    seen: dict[str, Located] = {}
    for item in items:
        if item.text in seen:
            raise probes.fail(item, f"{item.text!r} is already {seen[item.text].key}")
        seen[item.text] = item
