"""`raylm eval --dry-run`: what a run would do and cost, from its config, tokenizer and data alone. The driver's own
steps build the requests and shards (raylm.evaluate.driver), the scorer's own planner counts the tokens each
shard's forward passes would run (raylm.scoring.scorer.planned_tokens), placement's own rule sizes the actors
(raylm.cluster.placement.plan, with raylm.evaluate.startup.shards_work, the Work a run sizes them by), and
raylm.cluster.estimate prices it. No weight is read, no Ray started, no actor asked for. plan.json's fields are
described in docs/dry-run.md."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from raylm.cluster.capacity import Capacity, NodeType
from raylm.cluster.checkpoint import Checkpoint
from raylm.cluster.estimate import CPU_THREAD_FLOPS_MEASURED, GPU_TYPES, seconds
from raylm.cluster.placement import DEFAULT_MAX_ACTORS, Ask, Work, plan
from raylm.config import EvalConfig
from raylm.evaluate.driver import run_manifest, run_selection, run_task_docs, tokenise
from raylm.evaluate.startup import RayStarted, shards_work
from raylm.models.identity import pin_revision
from raylm.models.spec import ModelSpec
from raylm.requests.generation import is_generation
from raylm.requests.shards import Shard, make_shards
from raylm.requests.table import MASKED_COLUMNS, forward_tokens
from raylm.scoring.attention import AttentionPlan
from raylm.storage.atomic import write_atomic
from raylm.storage.location import location, prepare_output

PLAN = "plan.json"
DEVICES = ("cpu", "cuda")
GIB = 2**30


@dataclass(frozen=True)
class ScoringShape:
    """What an actor's Scorer plans its forward passes with (raylm.scoring.scorer.Scorer), read from the model's
    config and its class built on the meta device instead of from loaded weights."""

    max_length: int
    token_budget: int
    batch_size: int | None
    plan: AttentionPlan
    max_predicted: int

    def tokens(self, table: pa.Table) -> tuple[int, int]:
        """(tokens in requests, tokens computed) the scorer counts for this shard."""
        from raylm.scoring.scorer import planned_tokens

        return planned_tokens(table["context"].to_pylist(), table["continuation"].to_pylist(), self.max_length,
                              self.token_budget, self.batch_size, True, self.plan, self.max_predicted)


@dataclass(frozen=True)
class ModelShape:
    """The model as far as a plan needs it: its parameters, the dtype its weights load in, the scorer it resolves
    to, and for a causal LM the scorer's shape on each device type."""

    parameters: int
    dtype: str
    bytes_per_parameter: int
    scorer: str
    shapes: dict[str, ScoringShape]
    kv_bytes_per_token: int | None


def model_shape(spec: ModelSpec, batch_size: int | None) -> ModelShape:
    """The model's shape from its config and checkpoint headers, as an actor's ResidentScorer would load it."""
    import torch

    from raylm.models.context import context_length
    from raylm.models.devices import meta_model
    from raylm.models.loading import (load_config, load_implementation, loaded_dtype, parameter_count,
                                      resolve_scorer)
    from raylm.scoring.attention import attention_plan
    from raylm.scoring.memory import kv_bytes_per_token
    from raylm.scoring.scorer import (GPU_START_TOKEN_BUDGET, cpu_token_budget, logits_budget_bytes,
                                      max_predicted_positions)

    config = load_config(spec)
    scorer = resolve_scorer(spec, config)
    dtype = loaded_dtype(spec, config)
    size = torch.finfo(dtype).bits // 8
    if scorer == "mlm":
        return ModelShape(parameter_count(spec), str(dtype).removeprefix("torch."), size, scorer, {}, None)
    implementation = load_implementation(config, spec.trust_remote_code)
    if implementation is not None:
        config._attn_implementation = implementation
    model = meta_model(config, "AutoModelForCausalLM", dtype, spec.trust_remote_code)
    head = model.get_output_embeddings()
    max_length = context_length(spec, config, "causal")
    budgets = {"cpu": cpu_token_budget(config), "cuda": GPU_START_TOKEN_BUDGET}
    shapes = {device: ScoringShape(max_length, budgets[device], batch_size, attention_plan(model),
                                   max_predicted_positions(model, head, logits_budget_bytes(device)))
              for device in DEVICES}
    return ModelShape(parameter_count(spec), str(dtype).removeprefix("torch."), size, scorer, shapes,
                      kv_bytes_per_token(config, dtype))


def shard_counts(shard: Shard, model: ModelShape) -> dict[str, Any]:
    """One shard's counts: requests, tokens in its requests, tokens computed per device type (None where the plan
    cannot count them: a masked LM's), and the most tokens its generations may add."""
    table = shard.table
    counts: dict[str, Any] = {"requests": table.num_rows, "generation_tokens_max": 0}
    if is_generation(table):
        # A generation prefills its prompt (a prefix shared by the whole shard once) and then decodes at most
        # max_gen_toks: the prompt tokens are the most it computes before decoding.
        prompt = int(pc.sum(pc.list_value_length(table["context"])).as_py() or 0)
        counts["generation_tokens_max"] = int(pc.sum(table["max_gen_toks"]).as_py() or 0)
        counts["in_requests"] = prompt
        counts["computed"] = {device: prompt for device in DEVICES}
        counts["computed_exact"] = False
    elif MASKED_COLUMNS[-1] in table.column_names or not model.shapes:
        counts["in_requests"] = forward_tokens(table)
        counts["computed"] = {device: None for device in DEVICES}
        counts["computed_exact"] = False
    else:
        per_device = {device: model.shapes[device].tokens(table) for device in DEVICES}
        counts["in_requests"] = per_device["cpu"][0]
        counts["computed"] = {device: computed for device, (_, computed) in per_device.items()}
        counts["computed_exact"] = True
    return counts


def _add(total: dict[str, Any], counts: dict[str, Any]) -> None:
    for key in ("requests", "in_requests", "generation_tokens_max"):
        total[key] = total.get(key, 0) + counts[key]
    computed = total.setdefault("computed", {device: 0 for device in DEVICES})
    for device in DEVICES:
        computed[device] = None if computed[device] is None or counts["computed"][device] is None else \
            computed[device] + counts["computed"][device]
    total["computed_exact"] = total.get("computed_exact", True) and counts["computed_exact"]


def done_shards(cfg: EvalConfig, manifest: dict[str, Any], shards: list[Shard]) -> tuple[set[int], str]:
    """The shards the output's checkpoint already holds for this very run (read, never written), and why none
    count where they do not."""
    if cfg.output is None:
        return set(), "no output"
    checkpoint = Checkpoint(cfg.output, manifest)
    if cfg.overwrite:
        return set(), "--overwrite discards what the output holds"
    differences = checkpoint.differences()
    if differences:
        return set(), f"the output holds another run's results (differing: {', '.join(sorted(differences))})"
    if not (checkpoint.root / "shards").is_dir():
        return set(), "nothing scored yet"
    done = set(checkpoint.load(shards))
    return done, f"{len(done)} of {len(shards)} shards already scored there"


def cost(cfg: EvalConfig, model: ModelShape, work: Work, computed: dict[str, int | None],
         generation_longest: tuple[int, int] | None) -> dict[str, Any]:
    """Actors, memory, wall time and GPU-hours per device type: this machine's CPU, and each of GPU_TYPES as a
    cluster that may add 1-GPU nodes of it. Actors are what placement would ask for, from the same Work."""
    weights = model.parameters * model.bytes_per_parameter
    out: dict[str, Any] = {}
    cpus = os.cpu_count() or 1
    cpu = plan(Ask("cpu", None, cfg.num_cpus, cfg.actors, work=work),
                     Capacity(({"CPU": float(cpus)},), (), "this machine"))
    tokens = computed["cpu"] if computed["cpu"] is not None else work.tokens
    one = seconds(tokens, model.parameters, CPU_THREAD_FLOPS_MEASURED * cpu.threads) if cpu.actors else 0.0
    out["cpu"] = {"cpus": cpus, "actors": cpu.actors, "threads_per_actor": cpu.threads,
                  "flops_per_actor": CPU_THREAD_FLOPS_MEASURED * cpu.threads,
                  "wall_s": one / max(cpu.actors, 1), "placement": cpu.reason}
    tokens = computed["cuda"] if computed["cuda"] is not None else work.tokens
    for gpu in GPU_TYPES:
        node = NodeType(f"{gpu.name} node", {"CPU": 8.0, "GPU": 1.0}, DEFAULT_MAX_ACTORS)
        placed = plan(Ask("cuda", cfg.num_gpus, cfg.num_cpus, cfg.actors, work=work),
                            Capacity((), (node,), f"a cluster of 1-GPU {gpu.name} nodes"))
        per_actor = gpu.memory_gib * GIB * max(placed.num_gpus, 1.0)
        entry: dict[str, Any] = {
            "actors": placed.actors, "gpus": placed.actors * placed.num_gpus,
            "memory_gib_per_actor": per_actor / GIB, "weights_fit": weights < per_actor,
            "flops_per_actor": gpu.flops, "placement": placed.reason}
        one = seconds(tokens, model.parameters, gpu.flops) if placed.actors else 0.0
        entry["wall_s"] = one / max(placed.actors, 1)
        entry["gpu_hours"] = one * placed.num_gpus / 3600
        if generation_longest is not None and model.kv_bytes_per_token and weights < per_actor:
            from raylm.scoring.memory import kv_share, slots_fitting

            cached = kv_share(int(per_actor - weights)) // model.kv_bytes_per_token
            longest, widest = generation_longest
            entry["kv_cached_tokens"] = cached
            entry["generation_slots"] = slots_fitting(cached, 0, longest, widest)
        out[gpu.name] = entry
    return out


def eval_plan(cfg: EvalConfig) -> dict[str, Any]:
    """The plan of `raylm eval` with this config, as plan.json holds it."""
    cfg.validate()
    cfg = replace(cfg, model=pin_revision(cfg.model))
    docs = run_task_docs(cfg)
    encoder, tables, _, _ = tokenise(cfg, docs, run_selection(cfg), RayStarted(True))
    shards = make_shards(tables, cfg.shard_requests)
    done, resume = done_shards(cfg, run_manifest(cfg, encoder, tables, shards), shards)
    model = model_shape(cfg.model, cfg.batch_size)
    tasks: dict[str, dict[str, Any]] = {}
    left: dict[str, Any] = {}
    generation_longest = None
    for name, (kind, table) in tables.items():
        tasks[name] = {"kind": kind, "documents": int(pc.count_distinct(table["doc_id"]).as_py())}
        if is_generation(table):
            contexts = pc.list_value_length(table["context"])
            longest = int(pc.max(pc.add(contexts, table["max_gen_toks"])).as_py() or 0)
            widest = int(pc.max(contexts).as_py() or 0)
            generation_longest = (max(longest, generation_longest[0]), max(widest, generation_longest[1])) \
                if generation_longest else (longest, widest)
    for shard in shards:
        counts = shard_counts(shard, model)
        _add(tasks[shard.task], counts)
        if shard.index not in done:
            _add(left, counts)
    todo = [s for s in shards if s.index not in done]
    work = shards_work(todo, model.parameters)
    computed = left.get("computed", {device: 0 for device in DEVICES})
    return {
        "command": "eval",
        "output": str(location(cfg.output)) if cfg.output is not None else None,
        "model": {"path": cfg.model.path, "revision": cfg.model.revision, "scorer": model.scorer,
                  "parameters": model.parameters, "dtype": model.dtype,
                  "weights_gib": model.parameters * model.bytes_per_parameter / GIB,
                  "max_length": next(iter(model.shapes.values())).max_length if model.shapes else None,
                  "prefix_sharing": model.shapes["cpu"].plan.prefix_sharing if model.shapes else None,
                  "token_budget": {d: s.token_budget for d, s in model.shapes.items()}},
        "tasks": tasks,
        "shards": {"total": len(shards), "done": len(done), "left": len(todo), "resume": resume},
        "left": {"requests": left.get("requests", 0), "in_requests": left.get("in_requests", 0),
                 "computed": computed, "generation_tokens_max": left.get("generation_tokens_max", 0),
                 "work_tokens": work.tokens},
        "cost": cost(cfg, model, work, computed, generation_longest),
    }


def write_plan(out: str | os.PathLike[str], plan_json: dict[str, Any]) -> str:
    """plan.json in the output folder; its location in words."""
    path = location(out) / PLAN
    write_atomic(path, json.dumps(plan_json, indent=1).encode())
    return str(path)


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def format_plan(p: dict[str, Any]) -> str:
    """The plan as the tables the command prints."""
    header = (f"{'task':<28} {'docs':>7} {'requests':>9} {'request tokens':>15} {'computed (CPU)':>15} "
              f"{'computed (GPU)':>15} {'generated at most':>18}")
    lines = [header]
    for name, t in p["tasks"].items():
        mark = "" if t.get("computed_exact", True) else " *"
        lines.append(f"{name:<28} {t['documents']:>7,} {t.get('requests', 0):>9,} {_n(t.get('in_requests')):>15} "
                     f"{_n(t['computed']['cpu']):>15} {_n(t['computed']['cuda']):>15} "
                     f"{t.get('generation_tokens_max', 0):>18,}{mark}")
    m, s = p["model"], p["shards"]
    model = (f"model {m['path']}: {m['parameters']:,} parameters, {m['weights_gib']:.2f} GiB of weights in "
             f"{m['dtype']}, {m['prefix_sharing'] or 'scorer ' + m['scorer']}")
    lines += ["", model,
              f"shards: {s['total']} ({s['resume']}); left: {p['left']['requests']:,} requests",
              "", f"{'device':<8} {'actors':>6} {'GPUs':>5} {'weights fit':>11} {'wall time':>10} {'GPU-hours':>10}"]
    for device, c in p["cost"].items():
        gpus = f"{c['gpus']:g}" if "gpus" in c else "-"
        fit = ("yes" if c["weights_fit"] else "no") if "weights_fit" in c else "-"
        hours = f"{c['gpu_hours']:.3g}" if "gpu_hours" in c else "-"
        name = f"CPU x{c['cpus']}" if device == "cpu" else device
        lines.append(f"{name:<8} {c['actors']:>6} {gpus:>5} {fit:>11} {_duration(c['wall_s']):>10} {hours:>10}")
    lines.append("GPU rates are assumptions (published dense bf16 peak x utilisation; docs/dry-run.md); "
                 "* : generation, computed tokens are at most its prompts'")
    return "\n".join(lines)


def print_plan(cfg: EvalConfig) -> int:
    """`raylm eval --dry-run`: the plan printed, and written to the output folder."""
    plan_json = eval_plan(cfg)
    print(format_plan(plan_json))
    if cfg.output is not None:
        prepare_output(cfg.output)
        print(f"plan written to {write_plan(cfg.output, plan_json)}")
    return 0
