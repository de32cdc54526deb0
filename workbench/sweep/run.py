"""Running a sweep: every point (baselines first) as a child of one MLflow parent run, resumable by name,
shared by any number of workers with the same name (claims: `workbench.sweep.claims`)."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rich.console import Console

from workbench.console import make_console
from workbench.grpo.build import resolve_device
from workbench.runs import quote
from workbench.sweep.claims import (
    CLAIM_TIMEOUT_S,
    POLL_S,
    SETTLE_S,
    ClaimLost,
    Heartbeat,
    PointState,
    claim_point,
    worker_id,
)
from workbench.sweep.grid import Point, SweepError, SweepPlan, plan_sweep
from workbench.sweep.plot import PLOT_NAME, speedup_vs_k_png
from workbench.sweep.results import Outcome, results_json, sweep_rows
from workbench.sweep.store import SweepStore
from workbench.tags import TAG_AXIS, TAG_ERROR, TAG_POINT, TAG_ROLE, TAG_STALE, TAG_SWEEP, TAG_WORKER
from workbench.timing import host_description
from workbench.tracking import check_store


def default_sweep_name(plan: SweepPlan) -> str:
    return f"{plan.base.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class SweepResult:
    name: str
    parent_run_id: str | None
    outcomes: list[Outcome]
    status: str  # FINISHED | FAILED | KILLED
    tracking_uri: str | None = None
    ran: int = 0  # points this worker ran


@dataclass
class _Worker:
    """One `wb sweep` process's part in a (possibly shared) sweep."""

    plan: SweepPlan
    name: str
    store: SweepStore
    console: Console
    progress: bool
    timeout: float
    settle_s: float
    poll_s: float
    id: str = field(default_factory=worker_id)
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    mine: set[str] = field(default_factory=set)  # run ids this worker ran
    errors: dict[str, str] = field(default_factory=dict)  # point key -> what it raised here
    # point key -> skipped (started before this worker) | other
    first_seen: dict[str, str] = field(default_factory=dict)

    def tags(self, p: Point) -> dict[str, str]:
        tags = {
            TAG_SWEEP: self.name,
            TAG_ROLE: "point",
            TAG_POINT: p.key,
            "workbench.sweep.baseline": str(p.is_baseline).lower(),
        }
        tags.update({TAG_AXIS + a.key: p.display(a) for a in self.plan.axes})
        return tags

    def work(self) -> None:
        """Passes over the points, claiming each open one, until every point is done or failed in
        this worker's time; between passes with nothing to claim it waits ``poll_s`` for the live
        claims of other workers (and takes over those that go stale)."""
        n, settled, told, waiting = len(self.plan.points), set(), set(), False
        while len(settled) < n:
            ran = False
            for i, p in enumerate(self.plan.points, 1):
                if p.key in settled:
                    continue
                label = p.label(self.plan.axes)
                st = claim_point(
                    self.store,
                    p.key,
                    f"{self.name}: {label}",
                    self.tags(p),
                    self.id,
                    self.since_ms,
                    self.timeout,
                    self.settle_s,
                )
                if st.kind in ("done", "failed"):
                    settled.add(p.key)
                    if st.run.run_id not in self.mine:
                        self._note(i, label, p, st)
                elif st.kind == "busy" and p.key not in told:
                    told.add(p.key)
                    self.console.print(
                        f"[{i}/{n}] {label}: claimed by worker {st.run.tags.get(TAG_WORKER, '?')}, moving on"
                    )
                elif st.kind == "claimed":
                    ran = True
                    self.run_point(i, label, p, st)
            if len(settled) < n and not ran:
                if not waiting:
                    self.console.print(f"waiting for {n - len(settled)} points claimed by other workers")
                    waiting = True
                time.sleep(self.poll_s)

    def _note(self, i: int, label: str, p: Point, st: PointState) -> None:
        n, who = len(self.plan.points), st.run.tags.get(TAG_WORKER, "?")
        if st.kind == "failed":
            self.console.print(f"[{i}/{n}] {label}: [red]failed[/] in worker {who}: {st.run.tags.get(TAG_ERROR, '?')}")
        elif st.run.start_time < self.since_ms:  # started before this worker: a resumed sweep's
            self.first_seen[p.key] = "skipped"
            self.console.print(f"[{i}/{n}] {label}: [cyan]skipped[/] (finished in run {st.run.run_id})")
        else:
            self.first_seen[p.key] = "other"
            self.console.print(f"[{i}/{n}] {label}: [cyan]done[/] by worker {who} (run {st.run.run_id})")

    def run_point(self, i: int, label: str, p: Point, st: PointState) -> None:
        """Run a claimed point into its claim run, the heartbeat beating; a point that raises ends FAILED
        (tagged with the error, for the other workers) and the sweep goes on."""
        from workbench.experiment import run_experiment

        run_id = st.run.run_id
        self.mine.add(run_id)
        took = "".join(f" (took over: {r.tags.get(TAG_STALE, 'stale')})" for r in st.stale)
        self.console.print(f"[{i}/{len(self.plan.points)}] [bold]{label}[/]{took}")
        spec = p.spec.model_copy(deep=True)
        spec.tracking.run_name = f"{self.name}: {label}"
        beat = Heartbeat(self.store.client, run_id, self.timeout / 4)
        try:
            with beat:
                run_experiment(
                    spec,
                    console=self.console,
                    progress=self.progress,
                    parent_run_id=self.store.parent_id,
                    tags=self.tags(p),
                    summary=False,
                    on_step=beat.check,
                    run_id=run_id,
                )
        except ClaimLost as e:
            self.console.print(f"[yellow]{label}: {e}[/]")
        except KeyboardInterrupt:
            with interrupts_deferred(deliver=False):  # a second Ctrl-C here would leave the claim RUNNING
                self.store.end_claim(run_id, "KILLED", {})
            raise
        except Exception as e:  # noqa: BLE001 - one bad point must not stop the sweep
            self.errors[p.key] = f"{type(e).__name__}: {e}"
            self.store.end_claim(run_id, "FAILED", {TAG_ERROR: self.errors[p.key]})
            self.console.print(f"[red]point failed[/] ({label}): {self.errors[p.key]}")

    def outcomes(self) -> list[Outcome]:
        """Every point as the store has it now (the same for every worker): its FINISHED run, else failed."""
        finished = self.store.finished_children()
        out = []
        for p in self.plan.points:
            r, warmup = finished.get(p.key), p.spec.measure.warmup_steps
            if r is not None:
                status = "ok" if r.run_id in self.mine else self.first_seen.get(p.key, "other")
                out.append(Outcome(p, status, r.run_id, r.steps(), warmup))
                continue
            error = self.errors.get(p.key)
            if error is None:
                failed = [x for x in self.store.point_runs(p.key) if TAG_ERROR in x.tags]
                error = failed[-1].tags[TAG_ERROR] if failed else "not finished"
            out.append(Outcome(p, "failed", error=error))
        return out

    def log_unpaired(self, outcomes: list[Outcome]) -> None:
        """``speedup/*_unpaired`` on this worker's unpaired points, against the baseline whoever ran it."""
        for o in outcomes:
            if o.status == "ok" and not o.point.is_baseline:
                pair = [x for x in outcomes if x.point.key in (o.point.key, o.point.baseline_key)]
                row = next(r for r in sweep_rows(pair) if not r.point.is_baseline)
                self.store.log_unpaired(row, o)


def run_sweep(
    plan: SweepPlan,
    name: str | None = None,
    console: Console | None = None,
    progress: bool = True,
    claim_timeout: float = CLAIM_TIMEOUT_S,
    settle_s: float = SETTLE_S,
    poll_s: float = POLL_S,
    ray: str | None = None,
    cpus_per_point: float = 1.0,
) -> SweepResult:
    """Run every point of ``plan`` (baselines first) as a child of one MLflow parent run.

    ``ray``: a Ray address (``local``, ``auto``, ``HOST:PORT``): the open points run as Ray tasks of
    ``cpus_per_point`` CPUs each (a GPU for a CUDA point), retried by Ray when a node dies
    (`workbench.sweep.ray_launch`); None: this process works through the points, sharing them with any
    other worker on the same name by claims (`workbench.sweep.claims`, the single-machine default).

    A point that raises is logged, marked failed (its child run is FAILED) and the sweep goes on.
    With a ``name`` used before (same experiment), the parent is resumed and its FINISHED points are
    skipped. Several processes with one name share the sweep: each point is claimed by one worker
    (`workbench.sweep.claims`; a claim whose heartbeat is older than ``claim_timeout`` s is taken
    over), a worker with nothing left to claim waits for the others' live claims, then every worker
    writes the same ``results.json`` (and ``speedup_vs_k.png``) read back from the store and ends the parent FINISHED if
    every point has a FINISHED run, FAILED otherwise. KeyboardInterrupt ends this worker's claim and the
    parent KILLED (a worker still running later ends it again) and is re-raised. With
    ``tracking.enabled: false`` nothing is logged, claimed or resumable.

    Raises:
        UnsearchableName: a ``name`` MLflow's filter syntax cannot spell (workbench.runs.quote).
    """
    console = console or make_console()
    name = name or default_sweep_name(plan)
    quote(name)  # UnsearchableName before anything runs: the sweep is found again by its name
    if not plan.base.tracking.enabled:
        if ray:
            raise SweepError("--ray needs tracking (tracking.enabled: true): the points report through MLflow")
        return _run_alone(plan, name, console, progress)
    if claim_timeout <= 2 * settle_s:
        raise ValueError(f"claim timeout {claim_timeout:g} s must exceed twice the settle time ({settle_s:g} s)")
    check_store(plan.base.tracking.tracking_uri, plan.base.tracking.experiment)
    if ray:
        from workbench.ray_cluster import connect
        from workbench.sweep.ray_launch import run_on_ray

        connect(ray)  # an unreachable cluster fails before the parent run opens
    store = SweepStore.open(plan.base, name)
    store.settle_s = settle_s
    tags = {
        TAG_SWEEP: name,
        TAG_ROLE: "parent",
        "workbench.spec": plan.base.name,
        "workbench.sweep.points": str(len(plan.points)),
        "workbench.sweep.fixed": " ".join(a.text for a in plan.fixed),
    }
    tags.update({TAG_AXIS + a.key: ",".join(a.values) for a in plan.axes})
    if ray:
        tags["workbench.sweep.launcher"] = "ray"
    store.open_parent(tags)
    w = _Worker(plan, name, store, console, progress, claim_timeout, settle_s, poll_s)
    done = len(store.finished_children(histories=False)) if store.resumed else 0
    console.print(
        f"sweep [bold]{name}[/]: {len(plan.points)} points"
        + (f", resuming ({done} already finished)" if store.resumed else "")
        + (f"; on Ray ({ray})" if ray else f"; worker {w.id}; {_machine(plan)}")
    )
    status, outcomes = "FAILED", []
    try:
        if ray:
            run_on_ray(w, ray, cpus=cpus_per_point)
        else:
            w.work()
        status = "DONE"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        try:
            outcomes = w.outcomes()
            if status == "DONE":
                status = "FAILED" if any(o.status == "failed" for o in outcomes) else "FINISHED"
            w.log_unpaired(outcomes)
            with tempfile.TemporaryDirectory() as tmp:
                store.close(status, results_json(name, plan, outcomes), _plot(outcomes, Path(tmp), name, console))
        except KeyboardInterrupt:  # another Ctrl-C during the cleanup: the parent still ends KILLED, then out
            with interrupts_deferred(deliver=False):
                store.end_parent("KILLED")
            raise
    return SweepResult(name, store.parent_id, outcomes, status, store.tracking_uri, len(w.mine))


@contextmanager
def interrupts_deferred(deliver: bool = True) -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs (a status write is not cut short by a Ctrl-C) and, when
    ``deliver``, raise the KeyboardInterrupt they meant after it; ``deliver=False``: the block is already
    the answer to one. Outside the main thread (no signal handlers there) the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if held and deliver:
        raise KeyboardInterrupt(f"signal {held[0]}")


def sweep(
    spec: str | Path | None,
    axes: list[str],
    name: str | None = None,
    repeats: int = 1,
    progress: bool = False,
    ray: str | None = None,
    cpus_per_point: float = 1.0,
) -> SweepResult:
    """Run a grid of experiments with their autoregressive baselines (``wb sweep``, from Python), paired per step.

    spec: a shipped spec's name or a YAML path (None: experiments/sweep.yaml); axes: ``wb sweep``'s arguments
    (``"drafter=ngram,draft_model"``, ``"k=1..7"``, ``"grpo.steps=3"``); name: the sweep's name in MLflow
    (re-running a name resumes it); ray: a Ray address (``local``, ``auto``, ``HOST:PORT``) to run the points
    as Ray tasks of ``cpus_per_point`` CPUs. Returns its status and per-point outcomes.

    Raises:
        SweepError / SpecError: a bad axis or spec, before anything runs.
    """
    plan = plan_sweep(None if spec is None else str(spec), list(axes), repeats=repeats)
    return run_sweep(
        plan, name=name, console=Console(quiet=not progress), progress=progress, ray=ray, cpus_per_point=cpus_per_point
    )


def _machine(plan: SweepPlan) -> str:
    """Where the sweep runs, for its first line: the CPU model and its instruction sets (AVX-512, AMX)
    or the GPU; each point's run tags it again, with the engine's forward path (packed weights or not)."""
    try:
        return f"on {host_description(resolve_device(plan.base.model.device))}"
    except ValueError as e:  # an unavailable device: the points will say so themselves
        return f"device: {e}"


def _plot(outcomes: list[Outcome], folder: Path, name: str, console: Console) -> Path | None:
    """``speedup_vs_k.png`` of the sweep's rows in ``folder`` (workbench.sweep.plot), or None: too few
    points, or drawing failed (a warning; the sweep's results do not depend on its picture)."""
    try:
        return speedup_vs_k_png(sweep_rows(outcomes), folder / PLOT_NAME, name)
    except Exception as e:  # noqa: BLE001 - e.g. a broken matplotlib backend
        console.print(f"[yellow]warning:[/] {PLOT_NAME} not drawn: {type(e).__name__}: {e}")
        return None


def _run_alone(plan: SweepPlan, name: str, console: Console, progress: bool) -> SweepResult:
    """``tracking.enabled: false``: every point once, in this process, nothing logged."""
    from workbench.experiment import run_experiment

    outcomes = []
    for i, p in enumerate(plan.points, 1):
        label = p.label(plan.axes)
        console.print(f"[{i}/{len(plan.points)}] [bold]{label}[/]")
        try:
            r = run_experiment(p.spec.model_copy(deep=True), console=console, progress=progress, summary=False)
            outcomes.append(Outcome(p, "ok", r.run_id, r.history, p.spec.measure.warmup_steps))
        except Exception as e:  # noqa: BLE001 - one bad point must not stop the sweep
            outcomes.append(Outcome(p, "failed", error=f"{type(e).__name__}: {e}"))
            console.print(f"[red]point failed[/] ({label}): {outcomes[-1].error}")
    status = "FAILED" if any(o.status == "failed" for o in outcomes) else "FINISHED"
    return SweepResult(name, None, outcomes, status, None, len(outcomes))
