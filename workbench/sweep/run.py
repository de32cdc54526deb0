"""Running a sweep: every point (baselines first) as a child of one MLflow parent run, resumable by name."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from workbench.sweep.grid import SweepPlan
from workbench.sweep.results import Outcome, results_json, sweep_rows
from workbench.sweep.store import SweepStore
from workbench.tags import TAG_AXIS, TAG_POINT, TAG_ROLE, TAG_SWEEP


def default_sweep_name(plan: SweepPlan) -> str:
    return f"{plan.base.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class SweepResult:
    name: str
    parent_run_id: str | None
    outcomes: list[Outcome]
    status: str  # FINISHED | FAILED | KILLED
    tracking_uri: str | None = None


def run_sweep(plan: SweepPlan, name: str | None = None, console: Console | None = None, progress: bool = True) -> SweepResult:
    """Run every point of ``plan`` (baselines first) as a child of one MLflow parent run.

    A point that raises is logged, marked failed (its child run is FAILED) and the sweep goes on;
    the parent ends FINISHED if every point is done, FAILED if any failed. KeyboardInterrupt marks
    the parent KILLED, logs the partial ``results.json`` and is re-raised. With a ``name`` used
    before (same experiment), the earlier parent is resumed and its FINISHED points are skipped.
    With ``tracking.enabled: false`` nothing is logged and nothing can be resumed.
    """
    from workbench.experiment import run_experiment

    console = console or Console()
    name = name or default_sweep_name(plan)
    store = SweepStore(plan.base, name) if plan.base.tracking.enabled else None
    done: dict[str, Any] = {}  # point hash -> finished child run (resume)
    if store:
        tags = {TAG_SWEEP: name, TAG_ROLE: "parent", "workbench.spec": plan.base.name, "workbench.sweep.points": str(len(plan.points)),
                "workbench.sweep.fixed": " ".join(a.text for a in plan.fixed)}
        tags.update({TAG_AXIS + a.key: ",".join(a.values) for a in plan.axes})
        store.open_parent(tags)
        done = store.finished_children() if store.resumed else {}
        console.print(f"sweep [bold]{name}[/]: {len(plan.points)} points" + (f", resuming ({len(done)} already finished)" if store.resumed else ""))

    outcomes: list[Outcome] = []
    status = "FAILED"
    try:
        for i, p in enumerate(plan.points, 1):
            label = p.label(plan.axes)
            if p.key in done:
                o = Outcome(p, "skipped", done[p.key].run_id, done[p.key].steps(), p.spec.measure.warmup_steps)
                console.print(f"[{i}/{len(plan.points)}] {label}: [cyan]skipped[/] (finished in run {o.run_id})")
            else:
                console.print(f"[{i}/{len(plan.points)}] [bold]{label}[/]")
                spec = p.spec.model_copy(deep=True)
                spec.tracking.run_name = f"{name}: {label}"
                tags = {TAG_SWEEP: name, TAG_ROLE: "point", TAG_POINT: p.key, "workbench.sweep.baseline": str(p.is_baseline).lower()}
                tags.update({TAG_AXIS + a.key: p.display(a) for a in plan.axes})
                try:
                    r = run_experiment(spec, console=console, progress=progress, parent_run_id=store and store.parent_id,
                                       tags=tags, summary=False)
                    o = Outcome(p, "ok", r.run_id, r.history, p.spec.measure.warmup_steps)
                except Exception as e:  # noqa: BLE001 - one bad point must not stop the sweep
                    o = Outcome(p, "failed", error=f"{type(e).__name__}: {e}")
                    console.print(f"[red]point failed[/] ({label}): {o.error}")
            outcomes.append(o)
            if store and o.status == "ok" and not p.is_baseline:  # baselines run first: known by now
                row = next(r for r in sweep_rows([x for x in outcomes if x.point.key in (p.key, p.baseline_key)]) if not r.point.is_baseline)
                store.log_unpaired(row, o)
        status = "FAILED" if any(o.status == "failed" for o in outcomes) else "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if store:
            store.close(status, results_json(name, plan, outcomes))
    return SweepResult(name, store and store.parent_id, outcomes, status, store and store.tracking_uri)
