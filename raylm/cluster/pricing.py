"""What a dry run's plan costs per device type, from the one work estimate (raylm.cluster.estimate) and the one
placement rule (raylm.cluster.placement): this machine's CPU, and each of GPU_TYPES as a cluster that may add
1-GPU nodes of it. Every dry run (`raylm eval`, `raylm sweep`, `raylm ppl`, `raylm kl`) prices, prints and
writes its plan here, so their numbers mean the same thing; plan.json's fields are described in docs/dry-run.md."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

from raylm.cluster.capacity import Capacity, NodeType
from raylm.cluster.estimate import CPU_RUN_START_S, CPU_THREAD_FLOPS_MEASURED, GPU_TYPES, seconds
from raylm.cluster.placement import DEFAULT_MAX_ACTORS, Ask, plan, threads_with_reading
from raylm.models.spec import ModelSpec
from raylm.scoring.shape import ModelShape
from raylm.storage.atomic import write_atomic
from raylm.storage.location import location, prepare_output

PLAN = "plan.json"
GIB = 2**30
RATES_NOTE = "GPU rates are assumptions (published dense bf16 peak x utilisation; docs/dry-run.md)"


def price(ask: Ask, parameters: int, weights_bytes: int, computed: dict[str, int | None],
          uncounted_tokens: int, cpu_start_s: float = CPU_RUN_START_S) -> dict[str, Any]:
    """Actors, memory, wall time and GPU-hours per device type, for `computed` tokens per device type ("cpu",
    "cuda"; `uncounted_tokens` where one is None) through `parameters` per token; a run on this machine's CPU
    also costs `cpu_start_s` besides scoring. The actors are what placement asks for with `ask` (its device set to
    each type), so a run on such a cluster asks for what the plan says."""
    out: dict[str, Any] = {}
    cpus = os.cpu_count() or 1
    cpu = plan(replace(ask, device="cpu", num_gpus=None), Capacity(({"CPU": float(cpus)},), (), "this machine"))
    threads = threads_with_reading(cpu.threads, cpu.actors, ask.reserve_cpus) if cpu.actors else cpu.threads
    tokens = computed["cpu"] if computed["cpu"] is not None else uncounted_tokens
    flops = CPU_THREAD_FLOPS_MEASURED * threads
    start = cpu_start_s if cpu.actors else 0.0
    one = seconds(tokens, parameters, flops) if cpu.actors else 0.0
    out["cpu"] = {"cpus": cpus, "actors": cpu.actors, "threads_per_actor": threads, "flops_per_actor": flops,
                  "start_s": start, "wall_s": start + one / max(cpu.actors, 1), "placement": cpu.reason}
    tokens = computed["cuda"] if computed["cuda"] is not None else uncounted_tokens
    for gpu in GPU_TYPES:
        node = NodeType(f"{gpu.name} node", {"CPU": 8.0, "GPU": 1.0}, DEFAULT_MAX_ACTORS)
        placed = plan(replace(ask, device="cuda"), Capacity((), (node,), f"a cluster of 1-GPU {gpu.name} nodes"))
        per_actor = gpu.memory_gib * GIB * max(placed.num_gpus, 1.0)
        one = seconds(tokens, parameters, gpu.flops) if placed.actors else 0.0
        out[gpu.name] = {
            "actors": placed.actors, "gpus": placed.actors * placed.num_gpus,
            "memory_gib_per_actor": per_actor / GIB, "weights_fit": weights_bytes < per_actor,
            "flops_per_actor": gpu.flops, "placement": placed.reason,
            "wall_s": one / max(placed.actors, 1), "gpu_hours": one * placed.num_gpus / 3600}
    return out


def model_entry(spec: ModelSpec, shape: ModelShape, prefix_sharing: str | None) -> dict[str, Any]:
    """A model as plan.json describes it (`model`, and a KL run's `model_b`)."""
    return {"path": spec.path, "revision": spec.revision, "scorer": shape.scorer, "parameters": shape.parameters,
            "dtype": shape.dtype, "weights_gib": shape.weights_bytes / GIB, "prefix_sharing": prefix_sharing}


def model_line(m: dict[str, Any]) -> str:
    """A model_entry in words."""
    return (f"model {m['path']}: {m['parameters']:,} parameters, {m['weights_gib']:.2f} GiB of weights in "
            f"{m['dtype']}, {m['prefix_sharing'] or 'scorer ' + m['scorer']}")


def cost_table(cost: dict[str, Any]) -> list[str]:
    """The per-device-type lines every dry run prints."""
    lines = [f"{'device':<8} {'actors':>6} {'GPUs':>5} {'weights fit':>11} {'wall time':>10} {'GPU-hours':>10}"]
    for device, c in cost.items():
        gpus = f"{c['gpus']:g}" if "gpus" in c else "-"
        fit = ("yes" if c["weights_fit"] else "no") if "weights_fit" in c else "-"
        hours = f"{c['gpu_hours']:.3g}" if "gpu_hours" in c else "-"
        name = f"CPU x{c['cpus']}" if device == "cpu" else device
        lines.append(f"{name:<8} {c['actors']:>6} {gpus:>5} {fit:>11} {duration(c['wall_s']):>10} {hours:>10}")
    return lines


def count(value: int | None) -> str:
    """A token count as the tables print it; `?` where the plan does not count it."""
    return "?" if value is None else f"{value:,}"


def duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def publish(text: str, plan_json: dict[str, Any], out: str | os.PathLike[str] | None) -> int:
    """A dry run's ending: its tables printed, and its plan written to the run's output folder (where it has one)."""
    print(text)
    if out is not None:
        prepare_output(out)
        print(f"plan written to {write_plan(out, plan_json)}")
    return 0


def write_plan(out: str | os.PathLike[str], plan_json: dict[str, Any]) -> str:
    """plan.json in the output folder; its location in words."""
    path = location(out) / PLAN
    write_atomic(path, json.dumps(plan_json, indent=1).encode())
    return str(path)
