"""`raylm sweep --dry-run`: each point's plan (raylm.evaluate.dry_run.eval_plan, resuming from the point's own
checkpoint as the run would), which points are already finished and would be skipped (raylm.sweep.run's own
judgement, with nothing moved aside), and the order the models run in. Nothing is loaded and no Ray started."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from raylm.evaluate.dry_run import DEVICES, eval_plan
from raylm.models.identity import pin_revision
from raylm.storage.location import Location, location
from raylm.sweep.config import Sweep
from raylm.sweep.run import corpus_is_current, point_config, point_is_current


def sweep_plan(sweep: Sweep, out: str | os.PathLike[str] | Location) -> dict[str, Any]:
    """The sweep's plan, as the sweep's plan.json holds it."""
    out = location(out)
    sweep = replace(sweep, models=tuple(replace(m, spec=pin_revision(m.spec)) for m in sweep.models))
    models = []
    for model in sweep.models:
        points: list[dict[str, Any]] = []
        for point in sweep.points:
            done = point_is_current(sweep, model, point, out, dry=True)
            entry: dict[str, Any] = {"point": point.name, "kind": "eval", "done": done}
            if not done:
                entry["plan"] = eval_plan(point_config(sweep, model, point, out, sweep.num_cpus))
            points.append(entry)
        for corpus in sweep.corpora:
            points.append({"point": corpus.point, "kind": "corpus",
                           "done": corpus_is_current(sweep, model, corpus, out, dry=True)})
        models.append({"model": model.name, "path": model.spec.path, "points": points,
                       "runs": [p["point"] for p in points if not p["done"]],
                       "skips": [p["point"] for p in points if p["done"]]})
    return {"command": "sweep", "output": str(out), "actors_per_model": sweep.actors_per_model,
            # Each model with work gets a thread, in the sweep file's order; Ray runs them side by side as far as
            # the cluster holds their actors and queues the rest in that order (raylm.sweep.run._run_models).
            "order": [m["model"] for m in models if m["runs"]], "models": models,
            "totals": _totals(models)}


def _totals(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens to compute and GPU-hours summed over the eval points left (corpora are not priced)."""
    computed = {device: 0 for device in DEVICES}
    hours: dict[str, float] = {}
    for model in models:
        for point in model["points"]:
            plan = point.get("plan")
            if plan is None:
                continue
            for device in DEVICES:
                value = plan["left"]["computed"][device]
                computed[device] = None if value is None or computed[device] is None else computed[device] + value
            for name, cost in plan["cost"].items():
                if "gpu_hours" in cost:
                    hours[name] = hours.get(name, 0.0) + cost["gpu_hours"]
    return {"computed": computed, "gpu_hours": hours}


def format_sweep_plan(plan: dict[str, Any]) -> str:
    """The points, whether each runs or is skipped, and the totals."""
    from raylm.evaluate.dry_run import format_plan

    lines = [f"models run in this order: {', '.join(plan['order']) or 'none (every point is finished)'}"]
    for model in plan["models"]:
        head = (f"== {model['model']} ({model['path']}): {len(model['runs'])} point(s) to run, "
                f"{len(model['skips'])} finished (skipped)")
        lines += ["", head]
        for point in model["points"]:
            lines.append(f"-- {point['point']}: {'finished, skipped' if point['done'] else 'runs'}")
            if "plan" in point:
                lines.append(format_plan(point["plan"]))
    totals = plan["totals"]
    hours = ", ".join(f"{name} {h:.3g}" for name, h in totals["gpu_hours"].items())
    total = (f"total over the points to run: {totals['computed']['cuda'] or 0:,} tokens to compute on GPU; "
             f"GPU-hours: {hours or 'none'}")
    lines += ["", total]
    return "\n".join(lines)
