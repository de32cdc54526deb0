"""`wb tune`: an Optuna study over a search space declared in the spec's ``tune:`` section (DESIGN.md §7).

    wb tune                       # experiments/tune.yaml, 10 trials in total
    wb tune micro.yaml --trials 20 --study s1 --storage postgresql://host/optuna

Decisions (documented for users in ``wb tune --help``):

- **Search space**: ``tune.params`` maps a dotted spec key to ``{type: categorical, choices}``,
  ``{type: int, low, high, step, log}`` or ``{type: float, low, high, log}``. Every key and every
  edge value (all choices; low and high) is checked against the spec before anything runs.
- **Objective** (always maximized): ``gen_tokens_per_s`` (mean gen/tokens_per_s), ``speedup_gen`` /
  ``speedup_step`` (autoregressive baseline seconds / trial seconds, for generation / the whole
  GRPO step). Means skip step 1 (warm-up) when there are >= 2 steps, as in `wb sweep`.
- **Baseline**: the speedup objectives need the trial's spec with ``drafter.kind=none``; it runs
  once per study and per distinct non-drafter setting (keyed by `sweep.point_key`), its means are
  stored in the study's user attrs (``baseline/<point>``) so a resumed study or another worker
  reuses them; it is logged as an MLflow child (``workbench.tune.role=baseline``). Two workers
  starting at the same moment may both run it (harmless: same measurement, last write wins).
- **Pruning**: after every GRPO step the running objective is reported (``trial.report``); the
  median pruner (default; ``startup_trials`` finished trials first, never at step 1) may prune.
  A pruned trial's MLflow child ends **FINISHED** with tags ``workbench.pruned=true`` and
  ``workbench.stopped_early=true`` (it did not fail: it was stopped on purpose).
- **--trials N is a total**: the study is topped up until it has N COMPLETE+PRUNED trials (a
  re-run with the same study name adds only the missing ones; several workers sharing one
  storage stop together at N). FAILed trials (a crash, Ctrl-C) do not count.
- **Resume**: ``optuna.create_study(load_if_exists=True)`` by study name (default
  ``<spec name>-tune``) in ``tune.storage`` (default ``sqlite:///optuna.db`` in the cwd). Ctrl-C
  marks the running trial FAIL (Optuna) and the MLflow parent KILLED; run again to continue.
- **MLflow**: one parent run per study (tag ``workbench.study``; re-used on resume), one child per
  trial (tags ``workbench.tune.trial`` and ``workbench.param.<key>``), ``tune/objective`` (and
  ``speedup/gen``, ``speedup/step`` when there is a baseline) logged on each child.
- **Output**: a table of trials, the best trial, and the best trial's complete spec (the
  ``tune`` section dropped) written to ``--out`` (default ``./best-<study>.yaml``); ``wb run`` runs it.
"""

from __future__ import annotations

import copy
import difflib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from rich import box
from rich.console import Console
from rich.table import Table

from workbench.experiment import EarlyStop, RunResult
from workbench.spec import (
    ExperimentSpec,
    FloatParam,
    IntParam,
    SpecError,
    TuneSpec,
    apply_overrides,
    flatten,
    read_raw_spec,
    validate_spec,
)
from workbench.sweep import _SweepStore, _tag_filter, paired_by_default, point_key, speedup

DEFAULT_TUNE_SPEC = "tune"
TAG_STUDY = "workbench.study"
TAG_ROLE = "workbench.tune.role"  # parent | baseline | trial
TAG_TRIAL = "workbench.tune.trial"
TAG_PARAM = "workbench.param."
BASELINE_ATTR = "baseline/"  # + point_key of the baseline spec -> {timing_s/gen, timing_s/step, gen/tokens_per_s, run_id}
UNTUNABLE = ("tune", "tracking", "name")
COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
# objective -> the per-step timing it divides (speedups) or the metric it averages
TIMING_KEY = {"speedup_gen": "timing_s/gen", "speedup_step": "timing_s/step"}
BASELINE_KEYS = ("timing_s/gen", "timing_s/step", "gen/tokens_per_s")


# ----------------------------------------------------------------------------- search space (pure)


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``raw`` with ``value`` at dotted ``key`` (sections created as needed)."""
    data = copy.deepcopy(raw)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return data


def edge_values(p) -> list[Any]:
    """The values checked before a study runs: every choice, or low and high."""
    if isinstance(p, (IntParam, FloatParam)):
        return [p.low] if p.low == p.high else [p.low, p.high]
    return list(p.choices)


def check_params(raw: dict[str, Any], params: dict[str, Any]) -> None:
    """Every key of ``tune.params`` must be a tunable dotted key and every edge value valid.

    ``raw`` is the spec (overrides applied) without its tune section.

    Raises:
        SpecError: ``tune.params.<key>: ...`` naming the key and the fix.
    """
    known = sorted(k for k in flatten(validate_spec(raw).model_dump(mode="json")) if k.split(".")[0] not in UNTUNABLE)
    for key, p in params.items():
        where = f"tune.params.{key}"
        if key.split(".")[0] in UNTUNABLE:
            raise SpecError(f"{where}: {key.split('.')[0]}.* cannot be tuned (it names or logs the experiment); remove it from tune.params")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise SpecError(f"{where}: {key!r} is not a dotted spec key.{hint} Tunable keys: {', '.join(known)}")
        for v in edge_values(p):
            try:
                validate_spec(set_dotted(raw, key, v), source=f"spec with {key}={v!r}")
            except SpecError as e:
                raise SpecError(f"{where}: value {v!r} is not allowed; narrow the search space so every value is valid.\n{e}") from None


def suggest(trial: optuna.Trial, key: str, p) -> Any:
    if isinstance(p, IntParam):
        return trial.suggest_int(key, p.low, p.high, step=p.step, log=p.log)
    if isinstance(p, FloatParam):
        return trial.suggest_float(key, p.low, p.high, log=p.log)
    return trial.suggest_categorical(key, p.choices)


def grid_space(params: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: list(range(p.low, p.high + 1, p.step)) if isinstance(p, IntParam) else list(p.choices) for k, p in params.items()}


def make_sampler(tune: TuneSpec, seed: int) -> optuna.samplers.BaseSampler:
    if tune.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tune.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(tune.params), seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(tune: TuneSpec) -> optuna.pruners.BasePruner:
    if tune.pruner == "none":
        return optuna.pruners.NopPruner()
    # steps are 1-based and step 1 is warm-up: never prune before step 2
    return optuna.pruners.MedianPruner(n_startup_trials=tune.startup_trials, n_warmup_steps=2)


# ----------------------------------------------------------------------------- objective (pure)


def needs_baseline(objective: str) -> bool:
    return objective in TIMING_KEY


def baseline_summary(history: list[dict[str, float]]) -> dict[str, float | None]:
    r = RunResult(None, "", history)
    return {k: r.mean(k, skip_first=True) for k in BASELINE_KEYS}


def objective_value(objective: str, history: list[dict[str, float]], baseline: dict[str, Any] | None = None) -> float | None:
    """The objective over the steps so far (step 1 skipped when there are more); None if unknown.

    ``gen_tokens_per_s``: mean ``gen/tokens_per_s``; ``speedup_gen`` / ``speedup_step``: the
    baseline's mean ``timing_s/gen`` / ``timing_s/step`` divided by this run's mean.
    """
    r = RunResult(None, "", history)
    if objective == "gen_tokens_per_s":
        return r.mean("gen/tokens_per_s", skip_first=True)
    if objective not in TIMING_KEY:
        raise ValueError(f"unknown objective {objective!r}; allowed: gen_tokens_per_s, {', '.join(TIMING_KEY)}")
    key = TIMING_KEY[objective]
    return speedup((baseline or {}).get(key), r.mean(key, skip_first=True))


class TrialPrunedStop(EarlyStop, optuna.TrialPruned):
    """Raised from the per-step hook: ends the MLflow run FINISHED (EarlyStop) and the trial PRUNED."""

    def __init__(self, step: int, value: float):
        super().__init__(f"pruned at step {step} (objective {value:.4g})", tags={"workbench.pruned": "true"})
        self.step, self.value = step, value


def pruning_hook(trial: optuna.Trial, objective: str, baseline: dict[str, Any] | None) -> Callable[[int, dict], None]:
    """``on_step`` for run_experiment: report the running objective, raise TrialPrunedStop if pruned."""
    history: list[dict[str, float]] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        history.append(metrics)
        value = objective_value(objective, history, baseline)
        if value is None:
            return
        trial.report(value, step)
        if trial.should_prune():
            raise TrialPrunedStop(step, value)

    return on_step


# ----------------------------------------------------------------------------- plan


@dataclass
class TunePlan:
    spec_path: str
    raw: dict[str, Any]  # spec YAML with overrides, without the tune section
    base: ExperimentSpec  # validated, tune section included
    name: str  # study name
    storage: str

    @property
    def tune(self) -> TuneSpec:
        return self.base.tune

    def trial_spec(self, params: dict[str, Any]) -> ExperimentSpec:
        raw = self.raw
        for k, v in params.items():
            raw = set_dotted(raw, k, v)
        return paired_by_default(validate_spec(raw, source="trial spec"))


def plan_tune(spec: str | None, overrides: list[str] | None = None, study_name: str | None = None, storage: str | None = None) -> TunePlan:
    """Load the spec (default experiments/tune.yaml), apply overrides, validate the search space.

    Raises:
        SpecError: anything wrong (also an empty ``tune.params``), before anything runs.
    """
    path, raw = read_raw_spec(spec or DEFAULT_TUNE_SPEC)
    raw = apply_overrides(raw, overrides or [])
    base = validate_spec(raw, source=f"spec {path.name}" + (" with overrides" if overrides else ""))
    if not base.tune.params:
        raise SpecError(
            f"spec {path.name} has no search space: add a tune section, e.g.\n"
            "tune:\n  params:\n    drafter.kind: {type: categorical, choices: [ngram, draft_model]}\n    drafter.k: {type: int, low: 1, high: 6}"
        )
    raw = {k: v for k, v in raw.items() if k != "tune"}
    check_params(raw, base.tune.params)
    name = study_name or base.tune.study_name or f"{base.name}-tune"
    return TunePlan(str(path), raw, base, name, storage or base.tune.storage)


def open_study(plan: TunePlan) -> optuna.Study:
    """Create the study or load it by name (resume); its objective must match the spec's."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=plan.name, storage=plan.storage, direction=plan.tune.direction, load_if_exists=True,
        sampler=make_sampler(plan.tune, plan.base.seed), pruner=make_pruner(plan.tune),
    )
    stored = study.user_attrs.get("objective")
    if stored is None:
        study.set_user_attr("objective", plan.tune.objective)
        study.set_user_attr("spec", plan.spec_path)
    elif stored != plan.tune.objective:
        raise SpecError(
            f"study {plan.name!r} in {plan.storage} optimizes {stored}, not {plan.tune.objective}: "
            f"set tune.objective={stored} or use another --study name"
        )
    return study


def counted_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=COUNTED))


# ----------------------------------------------------------------------------- MLflow


class _StudyStore(_SweepStore):
    """The sweep's MLflow helper, with the parent run found by ``workbench.study`` instead."""

    def open_parent(self, tags: dict[str, str]) -> None:
        runs = self.client.search_runs(
            [self.experiment_id], f"{_tag_filter(TAG_STUDY, self.name)} and {_tag_filter(TAG_ROLE, 'parent')}",
            order_by=["attributes.start_time DESC"], max_results=1,
        )
        if runs:
            self.parent_id, self.resumed = runs[0].info.run_id, True
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            self.parent_id = self.client.create_run(self.experiment_id, run_name=f"tune {self.name}", tags=tags).info.run_id
        for k, v in tags.items():
            self.client.set_tag(self.parent_id, k, v)

    def log(self, run_id: str | None, metrics: dict[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        if run_id and items:
            self.client.log_batch(run_id, metrics=items)


# ----------------------------------------------------------------------------- orchestration


@dataclass
class TuneResult:
    name: str
    study: optuna.Study
    parent_run_id: str | None
    tracking_uri: str | None
    status: str  # FINISHED | KILLED | FAILED
    ran: int  # trials started by this call


def ensure_baseline(study: optuna.Study, spec: ExperimentSpec, name: str, store: _StudyStore | None,
                    console: Console, progress: bool) -> dict[str, Any]:
    """The baseline means for ``spec`` (drafter.kind=none): from the study's user attrs, else run once."""
    from workbench import experiment

    bspec = spec.model_copy(deep=True)
    bspec.drafter.kind = "none"
    key = BASELINE_ATTR + point_key(bspec)
    cached = study.user_attrs.get(key)
    if cached:
        return cached
    console.print(f"study [bold]{name}[/]: running the autoregressive baseline (drafter=none), once per study")
    bspec.tracking.run_name = f"{name}: baseline (drafter=none)"
    tags = {TAG_STUDY: name, TAG_ROLE: "baseline"}
    r = experiment.run_experiment(bspec, console=console, progress=progress, parent_run_id=store and store.parent_id, tags=tags, summary=False)
    summary = {**baseline_summary(r.history), "run_id": r.run_id}
    if store:
        store.log(r.run_id, {"speedup/gen": 1.0, "speedup/step": 1.0}, step=bspec.grpo.steps)
    study.set_user_attr(key, summary)
    return summary


def make_objective(plan: TunePlan, study: optuna.Study, store: _StudyStore | None, console: Console, progress: bool):
    from workbench import experiment

    obj = plan.tune.objective

    def objective(trial: optuna.Trial) -> float:
        params = {k: suggest(trial, k, p) for k, p in plan.tune.params.items()}
        label = " ".join(f"{k}={v}" for k, v in params.items())
        try:
            spec = plan.trial_spec(params)
            baseline = ensure_baseline(study, spec, plan.name, store, console, progress) if needs_baseline(obj) else None
            console.print(f"trial [bold]{trial.number}[/]: {label}")
            spec.tracking.run_name = f"{plan.name}: trial {trial.number}"
            tags = {TAG_STUDY: plan.name, TAG_ROLE: "trial", TAG_TRIAL: str(trial.number),
                    **{TAG_PARAM + k: str(v) for k, v in params.items()}}
            try:
                r = experiment.run_experiment(spec, console=console, progress=progress, parent_run_id=store and store.parent_id,
                                              tags=tags, summary=False, on_step=pruning_hook(trial, obj, baseline))
            except TrialPrunedStop as e:
                trial.set_user_attr("mlflow_run_id", e.run_id)
                if store:
                    store.log(e.run_id, {"tune/objective": e.value}, step=e.step)
                console.print(f"trial {trial.number}: [yellow]pruned[/] at step {e.step} (objective {e.value:.4g})")
                raise
            trial.set_user_attr("mlflow_run_id", r.run_id)
            value = objective_value(obj, r.history, baseline)
            if value is None:
                raise ValueError(f"objective {obj} could not be computed (no timing metrics logged)")
            if store:
                extra = {}
                if baseline:
                    extra = {f"speedup/{s}": objective_value(f"speedup_{s}", r.history, baseline) for s in ("gen", "step")}
                store.log(r.run_id, {"tune/objective": value, **extra}, step=spec.grpo.steps)
            console.print(f"trial {trial.number}: {obj} = [bold]{value:.4g}[/]")
            return value
        except optuna.TrialPruned:
            raise
        except Exception as e:  # noqa: BLE001 - reported, then Optuna marks the trial FAIL and goes on
            console.print(f"[red]trial {trial.number} failed[/] ({label}): {type(e).__name__}: {e}")
            raise

    return objective


def run_study(plan: TunePlan, trials: int, console: Console | None = None, progress: bool = True) -> TuneResult:
    """Top the study up to ``trials`` COMPLETE+PRUNED trials, each an MLflow child run.

    A trial that raises is marked FAIL and the study goes on. KeyboardInterrupt: the running trial
    is FAIL (Optuna), the parent run KILLED, and the interrupt re-raised.
    """
    console = console or Console()
    study = open_study(plan)
    done = counted_trials(study)
    remaining = max(0, trials - done)
    store = _StudyStore(plan.base, plan.name) if plan.base.tracking.enabled else None
    if store:
        tags = {TAG_STUDY: plan.name, TAG_ROLE: "parent", "workbench.spec": plan.base.name,
                "workbench.tune.objective": plan.tune.objective, "workbench.tune.storage": plan.storage}
        tags.update({TAG_PARAM + k: p.model_dump_json() for k, p in plan.tune.params.items()})
        store.open_parent(tags)
    console.print(
        f"study [bold]{plan.name}[/] ({plan.storage}): maximize {plan.tune.objective}; "
        f"{done} trials done, {remaining} to run (target {trials})"
    )
    status, before = "FAILED", len(study.trials)
    try:
        if remaining:
            study.optimize(
                make_objective(plan, study, store, console, progress), n_trials=remaining, catch=(Exception,),
                callbacks=[optuna.study.MaxTrialsCallback(trials, states=COUNTED)],
            )
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if store:
            best = best_trial(study)
            if best is not None:
                store.client.set_tag(store.parent_id, "workbench.tune.best_trial", str(best.number))
                store.log(store.parent_id, {"tune/best_objective": best.value}, step=best.number)
            store.close(status, results_json(plan, study))
    return TuneResult(plan.name, study, store and store.parent_id, store and store.tracking_uri, status, len(study.trials) - before)


# ----------------------------------------------------------------------------- results


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no COMPLETE trial yet
        return None


def results_json(plan: TunePlan, study: optuna.Study) -> dict[str, Any]:
    best = best_trial(study)
    return {
        "study": plan.name, "storage": plan.storage, "objective": plan.tune.objective,
        "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params},
        "trials": [
            {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
             "mlflow_run_id": t.user_attrs.get("mlflow_run_id"), "last_step": t.last_step}
            for t in study.trials
        ],
    }


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trials_table(plan: TunePlan, study: optuna.Study) -> Table:
    best = best_trial(study)
    table = Table(
        title=f"study {plan.name}: maximize {plan.tune.objective}", box=box.SIMPLE_HEAD,
        caption="value: the objective (pruned: its last reported value, at step 'steps'); ★ best",
    )
    keys = list(plan.tune.params)
    for c in ("#", *keys, "value", "steps", "state"):
        table.add_column(c, justify="right" if c in ("#", "value", "steps") else "left")
    style = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan"}
    for t in study.trials:
        value = t.value if t.value is not None else (t.intermediate_values.get(t.last_step) if t.last_step is not None else None)
        is_best = best is not None and t.number == best.number
        table.add_row(
            str(t.number), *[_fmt(t.params.get(k, "-")) for k in keys],
            ("-" if value is None else f"{value:.4g}") + (" ★" if is_best else ""),
            "-" if t.last_step is None else str(t.last_step),
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
        f"{plan.tune.objective} = {trial.value:.4g}\n# params: {params}\n# run it: wb run {path}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + spec.to_yaml())
    return path
