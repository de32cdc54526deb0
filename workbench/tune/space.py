"""`wb tune`'s search space: pure helpers over ``tune.params`` (no storage, no MLflow).

Every key and every edge value (all choices; low and high) of the search space is checked against
the spec before a study runs (:func:`check_params`), so a bad space fails before the first trial.
"""

from __future__ import annotations

import difflib
from typing import Any

import optuna

from workbench.specs import FloatParam, IntParam, SpecError, TuneSpec, flatten, set_dotted, validate_spec

UNTUNABLE = ("tune", "tracking", "name")


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
            raise SpecError(
                f"{where}: {key.split('.')[0]}.* cannot be tuned (it names or logs the experiment); remove it from "
                "tune.params"
            )
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise SpecError(f"{where}: {key!r} is not a dotted spec key.{hint} Tunable keys: {', '.join(known)}")
        for v in edge_values(p):
            try:
                validate_spec(set_dotted(raw, key, v), source=f"spec with {key}={v!r}")
            except SpecError as e:
                raise SpecError(
                    f"{where}: value {v!r} is not allowed; narrow the search space so every value is valid.\n{e}"
                ) from None


def suggest(trial: optuna.Trial, key: str, p) -> Any:
    """The trial's value of ``key`` from its search space ``p`` (Optuna's ``suggest_*``)."""
    if isinstance(p, IntParam):
        return trial.suggest_int(key, p.low, p.high, step=p.step, log=p.log)
    if isinstance(p, FloatParam):
        return trial.suggest_float(key, p.low, p.high, log=p.log)
    return trial.suggest_categorical(key, p.choices)


def grid_space(params: dict[str, Any]) -> dict[str, list[Any]]:
    return {
        k: list(range(p.low, p.high + 1, p.step)) if isinstance(p, IntParam) else list(p.choices)
        for k, p in params.items()
    }


def make_sampler(tune: TuneSpec, seed: int) -> optuna.samplers.BaseSampler:
    """The spec's sampler, seeded. TPE uses ``constant_liar`` (Optuna's setting for parallel
    workers: a RUNNING trial counts as a poor result, so workers do not crowd one region)."""
    if tune.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tune.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(tune.params), seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def reseed_for_trial(study: optuna.Study, tune: TuneSpec, seed: int, number: int) -> None:
    """Give the study a sampler seeded by (spec seed, trial number) before the trial's parameters
    are suggested. Trial numbers are unique across workers (the RDB storage assigns them), so
    workers started together no longer draw the same parameters from one seed, and a study stays
    reproducible trial by trial. Random and TPE sample at ``suggest_*`` time, after ``ask``; the
    grid sampler picks its grid point at ``ask`` and keeps its own seed."""
    if tune.sampler != "grid":
        study.sampler = make_sampler(tune, seed + number)


MIN_VALUES_BEFORE_PRUNING = 3  # one paired ratio is one noisy step: decide on a running mean of >= 3


def make_pruner(tune: TuneSpec, warmup_steps: int = 1) -> optuna.pruners.BasePruner:
    """The median pruner (or none). Steps are 1-based and nothing is reported during the
    ``warmup_steps`` warm-up steps; pruning starts once MIN_VALUES_BEFORE_PRUNING values were
    reported (step warmup_steps + 3), so a trial is never pruned on a single noisy step."""
    if tune.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(
        n_startup_trials=tune.startup_trials, n_warmup_steps=warmup_steps + MIN_VALUES_BEFORE_PRUNING
    )
