"""`wb tune`'s objective and its stored results (the rules are in `workbench.tune`'s docstring).

A trial's objective is scored from its per-step metrics (:func:`objective_score`, pure); what a
worker prints or writes at the end is read from the study's storage (:func:`trials_table`,
:func:`results_json`), so every worker of a study shows the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from rich import box
from rich.table import Table

from workbench import metrics as M
from workbench.experiment import EarlyStop
from workbench.specs import ExperimentSpec
from workbench.stats import after_warmup, ratio_ci
from workbench.tune.plan import OBJECTIVES, PAIRED_KEY, TunePlan

# ----------------------------------------------------------------------------- objective (pure)


@dataclass(frozen=True)
class Score:
    """A trial's objective over its steps after warm-up.

    ``low``/``high``: the 95 % interval (paired speedups with >= 2 steps; else None). ``n``: the
    number of steps the value rests on.
    """

    value: float
    low: float | None = None
    high: float | None = None
    n: int = 0


def objective_score(
    objective: str, history: list[dict[str, float]], warmup: int = 1, drafter_kind: str | None = None
) -> Score | None:
    """The objective of a run from its per-step metrics; None when they hold nothing to compute it.

    ``speedup_gen`` / ``speedup_step``: geometric mean and 95 % interval of the per-step paired
    ratios ``speedup/gen_per_step`` / ``speedup/step_per_step`` after ``warmup`` steps
    (`workbench.stats`; the same value as the run's last ``speedup/gen`` / ``speedup/step``); exactly 1.0 for
    ``drafter_kind == "none"`` (plain decoding is the autoregressive side). ``gen_tokens_per_s``: mean
    ``gen/tokens_per_s`` after warm-up.

    Raises:
        ValueError: an unknown objective.
    """
    if objective == "gen_tokens_per_s":
        vals = after_warmup([h[M.TOKENS_PER_S] for h in history if M.TOKENS_PER_S in h], warmup)
        return Score(sum(vals) / len(vals), n=len(vals)) if vals else None
    if objective not in PAIRED_KEY:
        raise ValueError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if drafter_kind == "none":
        return Score(1.0, n=len(after_warmup(history, warmup))) if history else None
    key = PAIRED_KEY[objective]
    vals = after_warmup([h[key] for h in history if key in h], warmup)
    if not vals:
        return None
    ci = ratio_ci(vals)
    return Score(ci.mean, ci.low, ci.high, ci.n)


class TrialPrunedStop(EarlyStop, optuna.TrialPruned):
    """Raised from the per-step hook: ends the MLflow run FINISHED (EarlyStop) and the trial PRUNED."""

    def __init__(self, step: int, score: Score):
        super().__init__(f"pruned at step {step} (objective {score.value:.4g})", tags={"workbench.pruned": "true"})
        self.step, self.score = step, score

    @property
    def value(self) -> float:
        return self.score.value


def pruning_hook(
    trial: optuna.Trial, objective: str, warmup: int = 1, drafter_kind: str | None = None
) -> Callable[[int, dict], None]:
    """``on_step`` for run_experiment: after each step past the warm-up, report the running
    objective; raise TrialPrunedStop if the pruner says so."""
    history: list[dict[str, float]] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        history.append(metrics)
        if len(history) <= warmup:  # a warm-up value would only add noise to the pruner's medians
            return
        score = objective_score(objective, history, warmup, drafter_kind)
        if score is None:
            return
        trial.report(score.value, step)
        if trial.should_prune():
            raise TrialPrunedStop(step, score)

    return on_step


# ----------------------------------------------------------------------------- results (read from storage)


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no COMPLETE trial yet
        return None


def trial_score(t: optuna.trial.FrozenTrial) -> Score | None:
    """A stored trial's value (pruned: its last reported one) and interval."""
    value = (
        t.value
        if t.value is not None
        else (t.intermediate_values.get(t.last_step) if t.last_step is not None else None)
    )
    if value is None:
        return None
    a = t.user_attrs
    return Score(value, a.get("ci95_low"), a.get("ci95_high"), a.get("n_steps", 0))


def fmt_score(s: Score | None) -> str:
    """``1.234 [1.18, 1.29]`` (value [95 % CI]); no brackets without an interval."""
    if s is None:
        return "-"
    return f"{s.value:.4g}" + (f" [{s.low:.3g}, {s.high:.3g}]" if s.low is not None and s.high is not None else "")


def is_surplus(t: optuna.trial.FrozenTrial) -> bool:
    """A trial a worker asked for after the target was reached (FAIL, user attr ``surplus``)."""
    return bool(t.user_attrs.get("surplus"))


def reported_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials in number order, surplus ones left out."""
    return sorted((t for t in study.get_trials(deepcopy=False) if not is_surplus(t)), key=lambda t: t.number)


def results_json(plan: TunePlan, study: optuna.Study) -> dict[str, Any]:
    best = best_trial(study)
    rows = []
    for t in reported_trials(study):
        s, a = trial_score(t), t.user_attrs
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": None if s is None else s.value,
                "ci95_low": a.get("ci95_low"),
                "ci95_high": a.get("ci95_high"),
                "n_steps": a.get("n_steps"),
                "steps": a.get("steps"),
                "params": t.params,
                "host": a.get("host"),
                "pid": a.get("pid"),
                "mlflow_run_id": a.get("mlflow_run_id"),
            }
        )
    return {
        "study": plan.name,
        "storage": plan.storage,
        "objective": plan.tune.objective,
        "counted": sum(1 for r in rows if r["state"] in ("COMPLETE", "PRUNED")),
        "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params},
        "trials": rows,
    }


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trials_table(plan: TunePlan, study: optuna.Study) -> Table:
    """The study's trials as stored (number order, surplus left out): the same in every worker."""
    best = best_trial(study)
    paired = plan.tune.objective in PAIRED_KEY
    table = Table(
        title=f"study {plan.name}: maximize {plan.tune.objective}",
        box=box.SIMPLE_HEAD,
        caption=(
            "value [95 % CI] over the steps after warm-up" if paired else "value: mean over the steps after warm-up"
        )
        + "; pruned: the last reported value; steps: GRPO steps run; ★ best",
    )
    keys = list(plan.tune.params)
    for c in ("#", *keys, "value", "steps", "host", "state"):
        table.add_column(c, justify="right" if c in ("#", "value", "steps") else "left")
    style = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan"}
    for t in reported_trials(study):
        is_best = best is not None and t.number == best.number
        steps = t.user_attrs.get("steps")
        table.add_row(
            str(t.number),
            *[_fmt(t.params.get(k, "-")) for k in keys],
            fmt_score(trial_score(t)) + (" ★" if is_best else ""),
            "-" if steps is None else str(steps),
            str(t.user_attrs.get("host", "-")),
            f"[{style.get(t.state.name, 'white')}]{t.state.name}[/]",
            style="bold" if is_best else None,
        )
    return table


def best_spec(plan: TunePlan, trial: optuna.trial.FrozenTrial) -> ExperimentSpec:
    """The complete spec of ``trial`` (tune section dropped): ``wb run`` runs it."""
    return plan.trial_spec({k: trial.params[k] for k in plan.tune.params if k in trial.params})


def write_best(plan: TunePlan, trial: optuna.trial.FrozenTrial, out: str | Path | None = None) -> Path:
    """Write the best trial's spec YAML to ``out`` (default ``./best-<study>.yaml``)."""
    path = Path(out) if out else Path(f"best-{plan.name}.yaml")
    spec = best_spec(plan, trial)
    params = " ".join(f"{k}={v}" for k, v in trial.params.items())
    header = (
        f"# Best trial {trial.number} of study {plan.name!r} ({plan.storage}): "
        f"{plan.tune.objective} = {fmt_score(trial_score(trial))}\n# params: {params}\n# run it: wb run {path}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + spec.to_yaml())
    return path
