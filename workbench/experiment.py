"""`wb run`: one experiment = one GRPO training run = one MLflow run, with Rich progress.

Orchestration only: the maths lives in workbench/grpo and workbench/rollout. Models and data are
prepared (built if missing) *before* the MLflow run opens (a sweep point's run, its claim, is opened
earlier: `workbench.sweep.claims`), so a run's logged timings never include a model build; a crash
or Ctrl-C inside the run ends it FAILED/KILLED with what it logged kept.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from workbench import metrics as M
from workbench.grpo.build import DrafterParts, TrainerParts
from workbench.grpo.completions import lengths_record
from workbench.grpo.drafter_health import DrafterHealth
from workbench.grpo.trainer import GRPOTrainer
from workbench.perf.modeled import build_modeled
from workbench.rollout.kpolicy import AdaptiveK
from workbench.run_build import build_parts
from workbench.specs import ExperimentSpec
from workbench.stats import PAIRED_SPEEDUPS, paired_summary, running_speedups
from workbench.tags import TAG_MACHINE, TAG_RUN_ERROR
from workbench.timing import host_description
from workbench.tracking import Tracker, check_store

STAGE_ORDER = (
    "data",
    "prepare",
    "gen",
    "gen_exposed",
    "reward",
    "logprob",
    "train",
    "draft_train",
    "other",
    "step",
    "gen_autoregressive",
)


class EarlyStop(Exception):
    """Raised by an ``on_step`` hook to end a run early on purpose (e.g. an Optuna trial pruned).

    The MLflow run ends FINISHED (not FAILED) with tag ``workbench.stopped_early=true`` plus
    ``tags``, and ``stopped_at_step``; ``run_id`` and ``history`` are filled in before it is re-raised.
    """

    def __init__(self, message: str = "stopped early", tags: dict[str, str] | None = None):
        super().__init__(message)
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        self.history: list[dict[str, float]] = []


@dataclass
class RunResult:
    run_id: str | None
    tracking_uri: str
    history: list[dict[str, float]] = field(default_factory=list)
    paired: dict[str, float | None] = field(default_factory=dict)  # stats.paired_summary of the history

    def mean(self, key: str, skip_first: bool = False) -> float | None:
        rows = self.history[1:] if skip_first and len(self.history) > 1 else self.history
        vals = [h[key] for h in rows if key in h]
        return sum(vals) / len(vals) if vals else None


def run_experiment(
    spec: ExperimentSpec,
    console: Console | None = None,
    progress: bool = True,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    summary: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Train ``spec.grpo.steps`` GRPO steps, logging every metric to MLflow; return the history.

    ``parent_run_id`` makes the MLflow run a child (one point of a sweep or one trial of a study);
    ``tags`` are added to the run; ``run_id`` logs into that existing RUNNING run (a sweep point's
    claim, opened before the models are prepared) instead of a new one. ``on_step(step, metrics)`` is called after each
    step's metrics are logged; if it raises, the run ends: :class:`EarlyStop` -> FINISHED with tag
    ``workbench.stopped_early=true`` (then re-raised), anything else -> FAILED/KILLED. Raises whatever the trainer
    raises (ValueError for bad input found while preparing: checkpoint, tokenizer, data file), after marking the run
    FAILED.
    """
    console = console or Console()
    progress = progress and os.environ.get("RANK", "0") == "0"  # data-parallel ranks: rank 0 shows progress
    if spec.tracking.enabled and run_id is None and os.environ.get("RANK", "0") == "0":
        check_store(spec.tracking.tracking_uri, spec.tracking.experiment)  # a broken store fails before the models
    parts = build_parts(spec, progress)  # builds missing models before the run opens
    trainer = None
    try:
        costs = _modeled_costs(spec, parts, progress)
        k_policy = (  # adaptive speculation chooses k_t from the same measured costs
            AdaptiveK(
                spec.drafter.k, costs.target.time, costs.drafter.step_at, measured=spec.drafter.adaptive_measured_steps
            )
            if spec.drafter.adaptive and costs is not None
            else None
        )
        trainer = GRPOTrainer(parts, modeled=costs if spec.measure.modeled else None, k_policy=k_policy)
        return _run(trainer, parts, spec, console, progress, parent_run_id, tags, summary, on_step, run_id)
    finally:
        if trainer is not None:
            trainer.close()  # the rollout worker of asynchronous GRPO, if any, and the rollout backends
        else:
            parts.close()


def _modeled_costs(spec: ExperimentSpec, parts: TrainerParts, progress: bool):
    """speedup/gen_modeled's cost curves (docs/design.md §8), loaded or measured before any run opens;
    the workbench engine's own (they say nothing of vLLM's): None on another backend. Data-parallel
    ranks: rank 0 measures into the cache, the others then load them."""
    if parts.rollout.backend != "workbench":
        return None
    with parts.ranks.main_first():
        prompts = [parts.prompt_format.encode(p) for p in parts.train_data["prompt"][:64]]
        return build_modeled(spec, parts.drafter.target, parts.drafter.drafter, prompts, progress)


def _run(
    trainer: GRPOTrainer,
    parts: TrainerParts,
    spec: ExperimentSpec,
    console: Console,
    progress: bool,
    parent_run_id: str | None,
    tags: dict[str, str] | None,
    summary: bool,
    on_step: Callable[[int, dict[str, float]], None] | None,
    run_id: str | None = None,
) -> RunResult:
    dp = parts.ranks.dp
    if dp is not None and not dp.is_main:  # rank 0 alone logs and shows the run
        progress, summary, t_enabled = False, False, False
    else:
        t_enabled = spec.tracking.enabled
    t = spec.tracking
    tags = {
        "workbench.drafter": spec.drafter.kind,
        "workbench.spec": spec.name,
        TAG_MACHINE: host_description(parts.ranks.device),
        **parts.backend.tags,
        **(tags or {}),
    }
    if dp is not None:
        tags["workbench.world_size"] = str(dp.world_size)
    tracker = Tracker(
        t.tracking_uri,
        t.experiment,
        run_name=t.run_name or _default_run_name(spec),
        enabled=t_enabled,
        tags=tags,
        parent_run_id=parent_run_id,
        run_id=run_id,
    )
    result = RunResult(None, tracker.tracking_uri)
    say = console.print if dp is None or dp.is_main else (lambda *a, **k: None)
    health = DrafterHealth(spec.drafter.on_collapse, lambda msg: say(f"[yellow]warning:[/] {msg}", highlight=False))
    with tracker, _error_tag(tracker):
        result.run_id = tracker.run_id
        tracker.log_params(spec.flat_params())
        tracker.log_text(spec.to_yaml(), "spec.yaml")
        _log_drafter_init(tracker, spec, parts.drafter)
        cols = (
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stage]:>9}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
        )
        with Progress(*cols, console=console, disable=not progress, transient=False) as bar:
            task = bar.add_task("grpo", total=spec.grpo.steps, stage="", info="")
            if spec.grpo.eval_every:
                ev = _timed_eval(trainer)
                tracker.log_metrics(ev, step=0)
            for step in range(1, spec.grpo.steps + 1):
                metrics, samples = trainer.step(step, on_stage=lambda s: bar.update(task, stage=s))
                metrics.update(health.check(step, metrics))  # the acceptance after this step's weight sync
                if spec.grpo.eval_every and (step % spec.grpo.eval_every == 0 or step == spec.grpo.steps):
                    bar.update(task, stage="eval")
                    metrics.update(_timed_eval(trainer))
                # speedup/gen, speedup/step: the run's estimate so far (its last value = speedup/gen_mean)
                metrics.update(running_speedups([*result.history, metrics], spec.measure.warmup_steps))
                tracker.log_metrics(metrics, step=step)
                if samples:
                    tracker.log_samples(samples, step=step)
                if trainer.completion_lengths:  # per-row lengths for `wb simulate` (workbench.grpo.completions)
                    tracker.log_dict(
                        lengths_record(trainer.completion_lengths, spec.grpo.group_size, spec.rollout.max_new_tokens),
                        f"{M.COMPLETION_LENGTHS_DIR}/step_{step:05d}.json",
                    )
                result.history.append(metrics)
                health.raise_if_failed()  # drafter.on_collapse=fail: the run ends FAILED, its metrics logged
                bar.update(task, advance=1, stage="", info=_progress_info(metrics))
                if on_step is not None:
                    try:
                        on_step(step, metrics)
                    except EarlyStop as e:
                        e.run_id, e.history = tracker.run_id, result.history
                        tracker.set_tags(
                            {"workbench.stopped_early": "true", "workbench.stopped_at_step": step, **e.tags}
                        )
                        tracker.end("FINISHED")  # idempotent: the `with` exit below is then a no-op
                        raise
        # Run-level paired speedups (means and 95 % CIs after warm-up), at the last step.
        result.paired = paired_summary(result.history, spec.measure.warmup_steps)
        tracker.log_metrics(result.paired, step=spec.grpo.steps)
        _log_drafter_checkpoint(tracker, parts.drafter)
    if progress and summary:
        console.print(summary_table(spec, result))
        if result.run_id:
            console.print(
                f"MLflow run [bold]{result.run_id}[/] in {result.tracking_uri} (view: mlflow ui --backend-store-uri "
                f"{result.tracking_uri})"
            )
    return result


@contextlib.contextmanager
def _error_tag(tracker: Tracker):
    """A run that fails keeps what it raised as the tag ``workbench.error`` (``Type: message``, 4000 characters
    at most) beside its FAILED status; an early stop (the run already ended FINISHED) and Ctrl-C tag nothing."""
    try:
        yield
    except EarlyStop:
        raise
    except Exception as e:
        with contextlib.suppress(Exception):  # never let the tag hide the exception that ended the run
            tracker.set_tags({TAG_RUN_ERROR: f"{type(e).__name__}: {e}"[:4000]})
        raise


def _log_drafter_init(tracker: Tracker, spec: ExperimentSpec, drafter: DrafterParts) -> None:
    """Params ``drafter.init.resolved_data`` / ``drafter.init.checkpoint`` and the init's held-out stats."""
    from drafters import drafter_class
    from workbench.drafter_init import init_info

    cls = drafter_class(spec.drafter.kind)
    if cls is None or not cls.trainable:
        return
    path = drafter.init_path
    tracker.log_params(
        {"drafter.init.resolved_data": spec.drafter.init_data(), "drafter.init.checkpoint": str(path or "")}
    )
    info = init_info(path)
    if info:
        tracker.log_dict(info, "drafter/init_info.json")
        after = info.get("held_out_after", {})
        tracker.log_metrics({f"draft_init/{k.split('/')[-1]}": v for k, v in after.items()}, step=0)


def _log_drafter_checkpoint(tracker: Tracker, parts: DrafterParts) -> None:
    """The drafter as it ends the run (adapted online, or as initialised) as run artifacts ``drafter/``."""
    d = parts.drafter
    if d is None or not d.trainable or not tracker.enabled or (parts.online is None and parts.init_path is None):
        return
    with tempfile.TemporaryDirectory() as tmp:
        d.save(Path(tmp))
        tracker.log_artifacts(tmp, "drafter")


def _timed_eval(trainer: GRPOTrainer) -> dict[str, float]:
    t0 = time.perf_counter()
    ev = trainer.evaluate()
    if ev:
        ev[M.EVAL_S] = time.perf_counter() - t0
    return ev


def _default_run_name(spec: ExperimentSpec) -> str:
    d = spec.drafter
    return f"{spec.name}-{d.kind}" + (f"-k{d.k}" if d.kind != "none" else "")


def _progress_info(m: dict[str, float]) -> str:
    parts = [f"{m.get(M.TOKENS_PER_S, 0):7.0f} tok/s", f"reward {m.get(M.REWARD_MEAN, 0):.2f}"]
    if M.ACCEPTANCE_LENGTH in m:
        parts.append(f"acc.len {m[M.ACCEPTANCE_LENGTH]:.2f}")
    return "  ".join(parts)


def fmt_ci(values: dict, key: str) -> str:
    """``1.23× [1.18, 1.29]`` from ``{key}_mean`` / ``_ci95_low`` / ``_ci95_high`` ('-' if missing)."""
    m, lo, hi = (values.get(f"{key}_{s}") for s in ("mean", "ci95_low", "ci95_high"))
    if m is None:
        return "-"
    return f"{m:.2f}×" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "")


def summary_table(spec: ExperimentSpec, result: RunResult) -> Table:
    """Mean per-stage times (step 1 excluded as warm-up when there are more), acceptance, reward."""
    table = Table(
        title=f"{spec.name}: drafter={spec.drafter.kind}"
        + (f" k={spec.drafter.k}" if spec.drafter.kind != "none" else "")
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for stage in STAGE_ORDER:
        v = result.mean(M.timing(stage), skip_first=True)
        if v is not None:
            table.add_row(f"{M.timing(stage)} (mean)", f"{v:.3f}")
    for key in (
        M.GEN_FRAC,
        M.TOKENS_PER_S,
        M.ACCEPTANCE_LENGTH,
        M.ACCEPTANCE_RATE,
        M.COMPLETIONS_MEAN_LENGTH,
        M.STALENESS,
    ):
        v = result.mean(key, skip_first=True)
        if v is not None:
            table.add_row(key, f"{v:.3f}")
    for key in PAIRED_SPEEDUPS:
        if result.paired.get(f"{key}_mean") is not None:
            table.add_row(f"{key} (paired, 95 % CI)", fmt_ci(result.paired, key))
    modeled = result.mean(M.SPEEDUP_GEN_MODELED, skip_first=True)
    if modeled is not None:  # counted forwards × the cached cost curve (workbench.perf.modeled): no timing noise
        table.add_row(f"{M.SPEEDUP_GEN_MODELED} (mean)", f"{modeled:.2f}×")
    h = result.history
    if h:
        table.add_row(f"{M.REWARD_MEAN} first -> last", f"{h[0][M.REWARD_MEAN]:.3f} -> {h[-1][M.REWARD_MEAN]:.3f}")
        evals = [m[M.EVAL_ACCURACY] for m in h if M.EVAL_ACCURACY in m]
        if evals:
            table.add_row(f"{M.EVAL_ACCURACY} (last)", f"{evals[-1]:.3f}")
    return table
