"""`wb tune`: an Optuna study over a search space declared in the spec's ``tune:`` section (docs/design.md §7, §8).

    wb tune                       # experiments/tune.yaml, 10 trials in total
    wb tune micro.yaml --trials 20 --study s1 --storage postgresql://host/optuna

Decisions (documented for users in ``wb tune --help``):

- **Search space**: ``tune.params`` maps a dotted spec key to ``{type: categorical, choices}``,
  ``{type: int, low, high, step, log}`` or ``{type: float, low, high, log}``. Every key and every
  edge value (all choices; low and high) is checked against the spec before anything runs
  (`workbench.tune.space`).
- **Objective** (always maximized): ``speedup_gen`` / ``speedup_step`` are *paired* speedups: every
  GRPO step of a trial also times plain autoregressive generation of the same prompts, interleaved
  (``measure.paired``, on in studies), and logs the ratios ``speedup/gen_per_step`` /
  ``speedup/step_per_step``. The trial's value is their geometric mean after ``measure.warmup_steps`` warm-up steps,
  with a 95 % interval (`workbench.stats.ratio_ci`). There is no study-level baseline: a ratio of timings taken
  at different times (or by another worker) is mostly load noise, while both sides of a pair share
  the load. A trial with ``drafter.kind=none`` is plain decoding: speedup exactly 1.0, no interval.
  ``measure.paired: false`` with a speedup objective is refused before anything runs.
  ``gen_tokens_per_s`` is the mean ``gen/tokens_per_s`` after warm-up (no interval).
- **Pruning**: after every step past the warm-up the running objective (same rule, steps so far) is
  reported (``trial.report``); the median pruner (default; ``startup_trials`` finished trials
  first) may prune from the first step after warm-up. A pruned trial's MLflow child ends
  **FINISHED** with tags ``workbench.pruned=true`` and ``workbench.stopped_early=true``.
- **--trials N is a total across workers**, never overshot: before asking for a trial a worker stops
  if the study has N COMPLETE+PRUNED+RUNNING trials; after asking, a trial with N non-FAIL trials
  before it (trial numbers are assigned atomically by the storage) is *surplus*: it is marked FAIL
  with user attr ``surplus=true``, left out of every table and count, and the worker stops. FAIL
  trials (a crash, Ctrl-C, a killed worker) do not count: a re-run tops the study up. A worker makes
  at most N - (COMPLETE+PRUNED at its start) attempts, so a spec that always crashes ends.
- **Workers**: any number of ``wb tune`` processes on one or several machines share a study through
  one storage (``tune.storage`` / ``--storage``, default ``sqlite:///optuna.db`` in the cwd, waiting
  up to 60 s on a locked sqlite file; any SQLAlchemy URL). Each trial records ``host`` and ``pid``.
  A worker killed mid-trial stops sending Optuna heartbeats; its RUNNING trial is failed (Optuna's
  ``fail_stale_trials``) after ``GRACE_PERIOD_S`` by whichever worker looks next.
- **Final table**: when its own loop ends, a worker waits (every ``POLL_S``) until no trial of the
  study is RUNNING, then reads the study back from storage: every worker prints the same table
  (trial number order; value [95 % CI], steps, host, state) and writes the same ``results.json``.
- **Resume**: the study is loaded by name (default ``<spec name>-tune``); its objective must match
  the spec's. Ctrl-C marks the running trial FAIL and the MLflow parent KILLED; run again to continue.
- **MLflow**: one parent run per study (tag ``workbench.study``; found with
  `workbench.runs.RunReader.find_parent` and re-used by every worker and on resume), one child per
  trial (tags ``workbench.tune.trial``, ``workbench.host``, ``workbench.param.<key>``; metrics
  ``tune/objective``, ``tune/objective_ci95_low``/``_high``). Two workers starting at the same
  moment may both create a parent: the older one is re-tagged ``workbench.tune.role=duplicate``
  when its creator sees the newer one (the one reports read). A new sqlite MLflow store is first
  opened under a file lock (workers would otherwise race through its schema migrations).
- **Output**: the table, the best trial, and the best trial's complete spec (the ``tune`` section
  dropped) written to ``--out`` (default ``./best-<study>.yaml``); ``wb run`` runs it.
"""

from workbench.tune.plan import DEFAULT_TUNE_SPEC, OBJECTIVES, PAIRED_KEY, TunePlan, check_paired, plan_tune
from workbench.tune.score import (
    Score,
    TrialPrunedStop,
    best_spec,
    best_trial,
    fmt_score,
    is_surplus,
    objective_score,
    pruning_hook,
    reported_trials,
    results_json,
    trial_score,
    trials_table,
    write_best,
)
from workbench.tune.space import (
    check_params,
    edge_values,
    grid_space,
    make_pruner,
    make_sampler,
    reseed_for_trial,
    suggest,
)
from workbench.tune.study import (
    TAG_HOST,
    TAG_PARAM,
    TAG_ROLE,
    TAG_STUDY,
    TAG_TRIAL,
    TuneResult,
    evaluate,
    open_study,
    run_study,
)
from workbench.tune.workers import make_storage, optuna_quiet, wait_for_others

__all__ = [
    "DEFAULT_TUNE_SPEC",
    "OBJECTIVES",
    "PAIRED_KEY",
    "Score",
    "TrialPrunedStop",
    "TunePlan",
    "TuneResult",
    "best_spec",
    "best_trial",
    "check_paired",
    "check_params",
    "edge_values",
    "evaluate",
    "fmt_score",
    "grid_space",
    "is_surplus",
    "make_pruner",
    "make_sampler",
    "objective_score",
    "open_study",
    "plan_tune",
    "pruning_hook",
    "reported_trials",
    "reseed_for_trial",
    "results_json",
    "run_study",
    "suggest",
    "trial_score",
    "trials_table",
    "write_best",
    "make_storage",
    "optuna_quiet",
    "wait_for_others",
    "TAG_HOST",
    "TAG_PARAM",
    "TAG_ROLE",
    "TAG_STUDY",
    "TAG_TRIAL",
]
