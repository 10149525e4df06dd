"""Sweep files (jobs/*.yaml) -> models × settings points, with every error naming the file, line and key.

The YAML is composed into nodes rather than loaded, so each value still knows the line it came from; values
are built with yaml's safe constructor only. Settings that change the weights in memory (dtype, quantization)
multiply the models; the rest (num_fewshot, limit, batch_size) multiply the points each model runs. Task names
are those of `raylm eval --tasks` (native, or any lm-eval task, group or tag, with `include_path` as its
--include-path), checked against lm-eval's index before anything runs; `gen_kwargs` is its --gen-kwargs.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raylm.config import DEFAULT_SHARD_REQUESTS, EvalConfig, check_limit, parse_batch_size
from raylm.corpus.read import FORMATS as CORPUS_FORMATS
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.data.yaml_nodes import NodeReader, read_top
from raylm.errors import RaylmError
from raylm.models.spec import (
    PLL_VARIANTS,
    QUANTIZATIONS,
    SCORERS,
    ModelSpec,
    check_choice,
    check_device,
    check_dtype,
    looks_local,
)
from raylm.storage.location import has_wildcards, is_uri
from raylm.tasks import TASKS
from raylm.tasks.lmeval.selection import refuse_native_clash

PACKAGED = "raylm:demo"  # the packaged stories260K model (as a model path) or the packaged data (as data_dir)
TOP_KEYS = ("models", "tasks", "corpora", "settings", "data_dir", "include_path", "seed", "device", "actors_per_model",
            "num_gpus", "num_cpus", "max_length", "decontaminate", "shard_size", "apply_chat_template",
            "fewshot_as_multiturn", "system_instruction", "chat_template_args", "metadata", "placement_timeout",
            "gen_kwargs")
MODEL_KEYS = ("path", "name", "dtype", "load_in_4bit", "load_in_8bit", "revision", "scorer", "pll", "max_length",
              "peft", "add_bos_token", "prefix_token_id")
CORPUS_KEYS = ("name", "data", "text_column", "format", "domain_column", "max_length", "stride")
SETTING_KEYS = ("num_fewshot", "limit", "batch_size", "dtype", "quantization")
NAME = re.compile(r"^[A-Za-z0-9._-]+$")

if TYPE_CHECKING:
    from raylm.corpus.run import CorpusConfig


@dataclass(frozen=True)
class SweepModel:
    """One set of weights in memory: a model path at one dtype and quantization; `name` is its output folder."""

    name: str
    spec: ModelSpec


@dataclass(frozen=True)
class SweepPoint:
    name: str
    num_fewshot: int | None  # None: each lm-eval task's own default (native tasks: 0)
    limit: int | float | None  # below 1: a fraction of each task's documents
    batch_size: int | None


@dataclass(frozen=True)
class SweepCorpus:
    """A corpus every model scores as `raylm ppl` would, with its options; its point's folder is `corpus-<name>`."""

    name: str
    data: str  # a path (relative ones resolved against the sweep file), glob or storage URI
    fmt: str = "auto"
    text_column: str = "text"
    domain_column: str | None = None
    max_length: int | None = None
    stride: int | None = None

    @property
    def point(self) -> str:
        return f"corpus-{self.name}"


@dataclass(frozen=True)
class Sweep:
    source: Path
    models: tuple[SweepModel, ...]
    points: tuple[SweepPoint, ...]
    tasks: tuple[str, ...]
    data_dir: Path | None
    seed: int | None = None  # lm-eval's --seed S (all four of its seeds); None keeps lm-eval's defaults
    actors_per_model: int = 1
    num_gpus: float | None = None
    num_cpus: float | None = None
    include_path: Path | None = None
    decontaminate: Path | None = None  # a `raylm contamination` output: `_decontaminate` metrics for every point
    shard_size: int = DEFAULT_SHARD_REQUESTS  # requests per shard: what a killed point loses at most per actor
    # Seconds a model's actors that no node can hold yet are waited for (raylm eval's --placement-timeout; None:
    # its default)
    placement_timeout: float | None = None
    # As raylm eval's --apply-chat-template, --fewshot-as-multiturn, --system-instruction, --chat-template-args and
    # --metadata, for every model and point.
    prompt: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    gen_kwargs: dict[str, Any] | None = None  # raylm eval's --gen-kwargs, for every generate_until task
    corpora: tuple[SweepCorpus, ...] = ()  # each model scores each as a point of its own, on its resident actor

    def config(self, model: SweepModel, point: SweepPoint) -> EvalConfig:
        seeds = {} if self.seed is None else {"fewshot_seed": self.seed, "random_seed": self.seed,
                                               "numpy_seed": self.seed, "torch_seed": self.seed}
        return EvalConfig(model.spec, self.tasks, self.data_dir, point.limit, point.num_fewshot,
                          batch_size=point.batch_size, actors=self.actors_per_model,
                          shard_requests=self.shard_size, progress=False,
                          num_gpus=self.num_gpus, include_path=self.include_path, log_samples=True,
                          decontaminate=self.decontaminate, metadata=self.metadata, gen_kwargs=self.gen_kwargs,
                          **self.prompt, **seeds)


    def corpus_config(self, model: SweepModel, corpus: SweepCorpus) -> CorpusConfig:
        """The corpus as `raylm ppl` runs it for this model."""
        from raylm.corpus.run import CorpusConfig

        return CorpusConfig(model.spec, corpus.data, fmt=corpus.fmt, text_column=corpus.text_column,
                            max_length=corpus.max_length, stride=corpus.stride, actors=self.actors_per_model,
                            progress=False, domain_column=corpus.domain_column)


def load_sweep(path: Path) -> Sweep:
    """Parse and check a sweep file; relative model and data paths resolve against the file's directory."""
    r, top = read_top(path, "sweep file", TOP_KEYS, ("models",))
    if "tasks" not in top and "corpora" not in top:
        raise RaylmError(f"{path}: line 1: tasks: missing (a sweep file needs 'tasks', 'corpora' or both)")
    base = path.resolve().parent
    grid = r.mapping(top["settings"], "settings", SETTING_KEYS) if "settings" in top else {}
    defaults = {"device": _device(r, top), "max_length": _positive(r, top, "max_length", int, None)}
    models = _models(r, top["models"], grid, base, defaults)
    include_path = _directory(r, top["include_path"], base, "include_path") if "include_path" in top else None
    tasks = _tasks(r, top["tasks"], include_path) if "tasks" in top else ()
    sweep = Sweep(
        source=path, models=models, points=_points(r, grid) if tasks else (), tasks=tasks,
        data_dir=_data_dir(r, top["data_dir"], base) if "data_dir" in top else None, include_path=include_path,
        seed=r.typed(top["seed"], "seed", int, "an integer") if "seed" in top else None,
        actors_per_model=_positive(r, top, "actors_per_model", int, 1),
        num_gpus=_positive(r, top, "num_gpus", (int, float), None, allow_zero=True),
        num_cpus=_positive(r, top, "num_cpus", (int, float), None),
        decontaminate=_scan(r, top["decontaminate"], base) if "decontaminate" in top else None,
        shard_size=_positive(r, top, "shard_size", int, DEFAULT_SHARD_REQUESTS),
        placement_timeout=_positive(r, top, "placement_timeout", (int, float), None),
        prompt=_prompt(r, top), metadata=_plain_mapping(r, top, "metadata"),
        gen_kwargs=_plain_mapping(r, top, "gen_kwargs"),
        corpora=_corpora(r, top["corpora"], base) if "corpora" in top else (),
    )
    for model in sweep.models:
        for point in sweep.points:
            try:
                sweep.config(model, point).validate()
            except RaylmError as e:
                raise RaylmError(f"{path}: {e}") from e
    return sweep


def _corpora(r: NodeReader, node: yaml.Node, base: Path) -> tuple[SweepCorpus, ...]:
    """`corpora:`: each a mapping with a `name` (its points' folder) and `data`, and optionally raylm ppl's
    --text-column, --format, --domain-column, --max-length and --stride."""
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, "corpora", "must be a non-empty list of mappings with a 'name' and 'data'")
    out: dict[str, SweepCorpus] = {}
    for i, item in enumerate(node.value):
        key = f"corpora[{i}]"
        fields = r.mapping(item, key, CORPUS_KEYS)
        for required in ("name", "data"):
            if required not in fields:
                raise r.fail(item, f"{key}.{required}", "missing (each corpus needs a 'name' and its 'data')")
        name = r.typed(fields["name"], f"{key}.name", str, "a string")
        if not NAME.match(name):
            raise r.fail(fields["name"], f"{key}.name",
                         f"{name!r} is not a usable folder name (letters, digits, . _ -)")
        if name in out:
            raise r.fail(fields["name"], f"{key}.name", f"{name!r} names another corpus too; give each a distinct name")
        text = {k: r.typed(fields[k], f"{key}.{k}", str, "a string")
                for k in ("text_column", "format", "domain_column") if k in fields}
        if text.get("format", "auto") not in CORPUS_FORMATS:
            raise r.fail(fields["format"], f"{key}.format",
                         f"unknown format {text['format']!r} (use {', '.join(CORPUS_FORMATS)})")
        lengths = {k: _count(r, fields[k], r.scalar(fields[k], f"{key}.{k}"), f"{key}.{k}", 1)
                   for k in ("max_length", "stride") if k in fields}
        out[name] = SweepCorpus(name, _corpus_data(r, fields["data"], base, f"{key}.data"), text.get("format", "auto"),
                                text.get("text_column", "text"), text.get("domain_column"), **lengths)
    return tuple(out.values())


def _corpus_data(r: NodeReader, node: yaml.Node, base: Path, key: str) -> str:
    """A storage URI as it is; a local path or glob relative to the sweep file, a plain path that must exist."""
    value = r.typed(node, key, str, "a path, glob or storage URI")
    if is_uri(value):
        return value
    path = base / Path(value).expanduser()
    if not has_wildcards(value) and not path.exists():
        raise r.fail(node, key, f"'{path}' does not exist")
    return os.path.abspath(path)


def _prompt(r: NodeReader, top: dict[str, yaml.Node]) -> dict[str, Any]:
    """The prompt keys as EvalConfig fields: apply_chat_template is true or a template name."""
    out: dict[str, Any] = {}
    if "apply_chat_template" in top:
        out["apply_chat_template"] = r.typed(top["apply_chat_template"], "apply_chat_template", (bool, str),
                                             "true, false or a template name")
    if "fewshot_as_multiturn" in top:
        out["fewshot_as_multiturn"] = r.typed(top["fewshot_as_multiturn"], "fewshot_as_multiturn", bool,
                                              "true or false")
    if "system_instruction" in top:
        out["system_instruction"] = r.typed(top["system_instruction"], "system_instruction", str, "a string")
    if "chat_template_args" in top:
        out["chat_template_args"] = _plain_mapping(r, top, "chat_template_args")
    return out


def _plain_mapping(r: NodeReader, top: dict[str, yaml.Node], key: str) -> dict[str, Any] | None:
    if key not in top:
        return None
    node = top[key]
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, key, "must be a mapping")
    return yaml.constructor.SafeConstructor().construct_mapping(node, deep=True)


def _positive(r: NodeReader, top: dict[str, yaml.Node], key: str, kind: type | tuple[type, ...], default: Any,
              allow_zero: bool = False) -> Any:
    if key not in top:
        return default
    value = r.typed(top[key], key, kind, "a number")
    if value < 0 or value == 0 and not allow_zero:
        raise r.fail(top[key], key, f"must be {'0 or more' if allow_zero else 'positive'}, got {value!r}")
    return value


def _device(r: NodeReader, top: dict[str, yaml.Node]) -> str:
    if "device" not in top:
        return "auto"
    return r.checked(top["device"], "device", check_device, r.typed(top["device"], "device", str, "a string"))


def _tasks(r: NodeReader, node: yaml.Node, include_path: Path | None) -> tuple[str, ...]:
    """Native names, and lm-eval names resolved as `raylm eval` resolves them, each error at its item's line."""
    items = [(item, r.typed(item, "tasks", str, "a task name")) for item, _ in r.values(node, "tasks")]
    if include_path is not None:
        for item, name in items:
            r.checked(item, "tasks", lambda n: _refuse_shadowed_native(n, include_path), name)
    native = {name for _, name in items if name in TASKS}
    lmeval = [(item, name) for item, name in items if name not in TASKS]
    if lmeval:
        from raylm.tasks.lmeval.extra import require_lm_eval

        r.checked(lmeval[0][0], "tasks", require_lm_eval, [name for _, name in lmeval])
    for item, name in lmeval:
        leaves = _lmeval_leaves(r, item, name, include_path)
        r.checked(item, "tasks", lambda n: refuse_native_clash([*sorted(native), n], leaves), name)
    return tuple(name for _, name in items)


def _refuse_shadowed_native(name: str, include_path: Path) -> None:
    from raylm.tasks.lmeval.extra import require_lm_eval_for_include_path

    require_lm_eval_for_include_path()
    from raylm.tasks.lmeval.names import refuse_shadowed_natives

    refuse_shadowed_natives([name], include_path)


def _lmeval_leaves(r: NodeReader, item: yaml.Node, name: str, include_path: Path | None) -> list[str]:
    from raylm.tasks.lmeval.names import select

    try:
        return select([name], include_path).leaves
    except RaylmError as e:
        raise r.fail(item, "tasks", str(e)) from e


def _data_dir(r: NodeReader, node: yaml.Node, base: Path) -> Path:
    value = r.typed(node, "data_dir", str, "a directory")
    return DEMO_DATA if value == PACKAGED else _directory(r, node, base, "data_dir")


def _directory(r: NodeReader, node: yaml.Node, base: Path, key: str) -> Path:
    path = (base / Path(r.typed(node, key, str, "a directory")).expanduser()).resolve()
    if not path.is_dir():
        raise r.fail(node, key, f"directory '{path}' does not exist")
    return path


def _scan(r: NodeReader, node: yaml.Node, base: Path) -> Path:
    """A `raylm contamination` output directory (or its contamination.json), relative to the sweep file."""
    path = (base / Path(r.typed(node, "decontaminate", str, "a path")).expanduser()).resolve()
    if not path.exists():
        raise r.fail(node, "decontaminate", f"'{path}' does not exist (run `raylm contamination` first)")
    return path


def _model_path(value: str, base: Path) -> str:
    """The packaged demo, a directory relative to the sweep file, or else a hub id."""
    if value == PACKAGED:
        return str(DEMO_MODEL)
    local = base / Path(value).expanduser()
    # abspath, not resolve: a symlinked model keeps the name it was given.
    return os.path.abspath(local) if looks_local(value) or local.exists() else value


def _models(r: NodeReader, node: yaml.Node, grid: dict[str, yaml.Node], base: Path, defaults: dict[str, Any]
            ) -> tuple[SweepModel, ...]:
    """Every model of the file at every grid dtype and quantization; `defaults` are the top-level ModelSpec fields
    (device, max_length) a model's own keys override."""
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, "models", "must be a non-empty list of model paths or mappings with a 'path'")
    dtypes = r.values(grid["dtype"], "settings.dtype") if "dtype" in grid else []
    quants = r.values(grid["quantization"], "settings.quantization") if "quantization" in grid else []
    for item, value in dtypes:
        r.checked(item, "settings.dtype", check_dtype, value)
    for item, value in quants:
        if value not in (None, "none", *QUANTIZATIONS):
            raise r.fail(item, "settings.quantization",
                         f"unknown quantization {value!r} (use none, {', '.join(QUANTIZATIONS)})")
    out: list[SweepModel] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(node.value):
        key = f"models[{i}]"
        spec, base_name, where = _model(r, item, key, base, defaults, bool(dtypes), bool(quants))
        for dtype_value, quant_value in itertools.product([v for _, v in dtypes] or [None],
                                                          [v for _, v in quants] or [False]):
            variant, name = spec, base_name
            if dtype_value is not None:
                variant, name = replace(variant, dtype=dtype_value), f"{name}-{dtype_value}"
            if quant_value is not False:
                quant = None if quant_value in (None, "none") else quant_value
                variant, name = replace(variant, quantization=quant), f"{name}-{quant or 'noquant'}"
            if not NAME.match(name):
                raise r.fail(where, f"{key}.name", f"{name!r} is not a usable folder name (letters, digits, . _ -)")
            if name in seen:
                raise r.fail(where, f"{key}.name", f"{name!r} is already used by models[{seen[name]}]; "
                                                   "give each model a distinct 'name'")
            seen[name] = i
            out.append(SweepModel(name, variant))
    return tuple(out)


def _model(r: NodeReader, item: yaml.Node, key: str, base: Path, defaults: dict[str, Any], grid_dtype: bool,
           grid_quant: bool) -> tuple[ModelSpec, str, yaml.Node]:
    """One entry of `models`: its spec, its folder name before grid suffixes, and the node to blame for the name."""
    fields = {"path": item} if isinstance(item, yaml.ScalarNode) else r.mapping(item, key, MODEL_KEYS)
    if "path" not in fields:
        raise r.fail(item, f"{key}.path", "missing (each model needs a hub id or a directory)")
    spec = ModelSpec(_model_path(r.typed(fields["path"], f"{key}.path", str, "a string"), base), **defaults)
    if "max_length" in fields:
        tokens = r.typed(fields["max_length"], f"{key}.max_length", int, "a number of tokens")
        if tokens < 1:
            raise r.fail(fields["max_length"], f"{key}.max_length", f"must be positive, got {tokens}")
        spec = replace(spec, max_length=tokens)
    if "revision" in fields:
        spec = replace(spec, revision=str(r.scalar(fields["revision"], f"{key}.revision")))
    if "peft" in fields:
        adapter = r.typed(fields["peft"], f"{key}.peft", str, "an adapter directory or hub id")
        spec = replace(spec, peft=_model_path(adapter, base))
    if "add_bos_token" in fields:
        spec = replace(spec, add_bos_token=r.typed(fields["add_bos_token"], f"{key}.add_bos_token", bool,
                                                   "true or false"))
    if "prefix_token_id" in fields:
        token = r.typed(fields["prefix_token_id"], f"{key}.prefix_token_id", int, "a token id")
        if token < 0:
            raise r.fail(fields["prefix_token_id"], f"{key}.prefix_token_id", f"must be 0 or more, got {token}")
        spec = replace(spec, prefix_token_id=token)
    for name, what, allowed in (("scorer", "scorer", SCORERS), ("pll", "PLL variant", PLL_VARIANTS)):
        if name in fields:
            value = r.typed(fields[name], f"{key}.{name}", str, "a string")
            r.checked(fields[name], f"{key}.{name}", lambda v: check_choice(what, v, allowed), value)
            spec = replace(spec, **{name: value})
    if "dtype" in fields:
        if grid_dtype:
            raise r.fail(fields["dtype"], f"{key}.dtype", "also given in settings.dtype; set it in one place")
        dtype = r.typed(fields["dtype"], f"{key}.dtype", str, "a dtype")
        spec = replace(spec, dtype=r.checked(fields["dtype"], f"{key}.dtype", check_dtype, dtype))
    for bits in QUANTIZATIONS:
        flag = f"load_in_{bits}"
        if flag in fields and r.typed(fields[flag], f"{key}.{flag}", bool, "true or false"):
            if grid_quant or spec.quantization:
                raise r.fail(fields[flag], f"{key}.{flag}", "conflicts with another quantization setting; choose one")
            spec = replace(spec, quantization=bits)
    if "name" in fields:
        return spec, r.typed(fields["name"], f"{key}.name", str, "a string"), fields["name"]
    return spec, _default_name(spec), item


def _default_name(spec: ModelSpec) -> str:
    name = Path(spec.path).name
    if spec.dtype != "auto":
        name += f"-{spec.dtype}"
    if spec.pll != PLL_VARIANTS[0]:
        name += f"-{spec.pll}"
    if spec.peft is not None:
        name += f"-{Path(spec.peft).name}"
    return f"{name}-{spec.quantization}" if spec.quantization else name


def _points(r: NodeReader, grid: dict[str, yaml.Node]) -> tuple[SweepPoint, ...]:
    shots = [None if v is None else _count(r, n, v, "settings.num_fewshot", 0)
             for n, v in r.values(grid["num_fewshot"], "settings.num_fewshot")] if "num_fewshot" in grid else [None]
    limits = [None if v is None else _limit(r, n, v) for n, v in r.values(grid["limit"], "settings.limit")] \
        if "limit" in grid else [None]
    batches = [_batch_size(r, n, v) for n, v in r.values(grid["batch_size"], "settings.batch_size")] \
        if "batch_size" in grid else [None]
    return tuple(SweepPoint(f"{'default' if k is None else k}shot-limit{limit or 'all'}-batch{batch or 'auto'}", k,
                            limit, batch)
                 for k, limit, batch in itertools.product(shots, limits, batches))


def _limit(r: NodeReader, node: yaml.Node, value: Any) -> int | float:
    """A document count, or below 1 a fraction of each task's documents (raylm eval's --limit)."""
    value = int(value) if isinstance(value, float) and value >= 1 and value.is_integer() else value
    return r.checked(node, "settings.limit", lambda v: check_limit(v, "limit"), value)


def _batch_size(r: NodeReader, node: yaml.Node, value: Any) -> int | None:
    try:
        return parse_batch_size(value, "")
    except RaylmError as e:
        raise r.fail(node, "settings.batch_size", str(e)) from e


def _count(r: NodeReader, node: yaml.Node, value: Any, key: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        extra = " or null (all)" if key.endswith("limit") else \
            " or null (each task's default)" if key.endswith("num_fewshot") else ""
        raise r.fail(node, key, f"must be an integer >= {minimum}{extra}, got {value!r}")
    return value
