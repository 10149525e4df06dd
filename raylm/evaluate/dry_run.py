"""`raylm eval --dry-run`: what a run would do and cost, from its config, tokenizer and data alone. The driver's own
steps build the requests and shards (raylm.evaluate.driver), the scorer's own planner counts the tokens each
shard's forward passes would run (raylm.scoring.scorer.planned_tokens), placement's own rule sizes the actors
(raylm.cluster.placement.plan, with raylm.evaluate.startup.shards_work, the Work a run sizes them by), and
raylm.cluster.pricing prices it. No weight is read, no Ray started, no actor asked for. plan.json's fields are
described in docs/dry-run.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow.compute as pc

from raylm.cluster.checkpoint import Checkpoint
from raylm.cluster.estimate import GPU_TYPES
from raylm.cluster.placement import Ask, Work
from raylm.cluster.pricing import GIB, RATES_NOTE, cost_table, count, model_entry, model_line, price, publish
from raylm.config import EvalConfig
from raylm.evaluate.driver import run_manifest, run_selection, run_task_docs, tokenise
from raylm.evaluate.startup import RayStarted, shards_work
from raylm.models.identity import pin_revision
from raylm.requests.generation import is_generation
from raylm.requests.shards import Shard, make_shards
from raylm.requests.table import MASKED_COLUMNS, forward_tokens
from raylm.scoring.shape import DEVICES, ModelShape, model_shape
from raylm.storage.location import location


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
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        per_device = {device: model.shapes[device].tokens(contexts, continuations) for device in DEVICES}
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
    """The run priced per device type (raylm.cluster.pricing), actors sized by placement from the same Work; where
    the run generates, each GPU type's keys-and-values budget and the slots it buys for the longest request."""
    out = price(Ask("auto", cfg.num_gpus, cfg.num_cpus, cfg.actors, work=work), model.parameters,
                model.weights_bytes, computed, work.tokens)
    if generation_longest is None or not model.kv_bytes_per_token:
        return out
    from raylm.scoring.memory import kv_share, slots_fitting

    for gpu in GPU_TYPES:
        entry = out[gpu.name]
        per_actor = int(entry["memory_gib_per_actor"] * GIB)
        if model.weights_bytes < per_actor:
            cached = kv_share(per_actor - model.weights_bytes) // model.kv_bytes_per_token
            entry["kv_cached_tokens"] = cached
            entry["generation_slots"] = slots_fitting(cached, 0, *generation_longest)
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
    sharing = model.shapes["cpu"].plan.prefix_sharing if model.shapes else None
    return {
        "command": "eval",
        "output": str(location(cfg.output)) if cfg.output is not None else None,
        "model": {**model_entry(cfg.model, model, sharing),
                  "max_length": next(iter(model.shapes.values())).max_length if model.shapes else None,
                  "token_budget": {d: s.token_budget for d, s in model.shapes.items()}},
        "tasks": tasks,
        "shards": {"total": len(shards), "done": len(done), "left": len(todo), "resume": resume},
        "left": {"requests": left.get("requests", 0), "in_requests": left.get("in_requests", 0),
                 "computed": computed, "generation_tokens_max": left.get("generation_tokens_max", 0),
                 "work_tokens": work.tokens},
        "cost": cost(cfg, model, work, computed, generation_longest),
    }


def format_plan(p: dict[str, Any]) -> str:
    """The plan as the tables the command prints."""
    header = (f"{'task':<28} {'docs':>7} {'requests':>9} {'request tokens':>15} {'computed (CPU)':>15} "
              f"{'computed (GPU)':>15} {'generated at most':>18}")
    lines = [header]
    for name, t in p["tasks"].items():
        mark = "" if t.get("computed_exact", True) else " *"
        lines.append(f"{name:<28} {t['documents']:>7,} {t.get('requests', 0):>9,} {count(t.get('in_requests')):>15} "
                     f"{count(t['computed']['cpu']):>15} {count(t['computed']['cuda']):>15} "
                     f"{t.get('generation_tokens_max', 0):>18,}{mark}")
    s = p["shards"]
    lines += ["", model_line(p["model"]),
              f"shards: {s['total']} ({s['resume']}); left: {p['left']['requests']:,} requests", "",
              *cost_table(p["cost"]),
              f"{RATES_NOTE}; * : generation, computed tokens are at most its prompts'"]
    return "\n".join(lines)


def print_plan(cfg: EvalConfig) -> int:
    """`raylm eval --dry-run`: the plan printed, and written to the output folder."""
    plan_json = eval_plan(cfg)
    return publish(format_plan(plan_json), plan_json, cfg.output)
