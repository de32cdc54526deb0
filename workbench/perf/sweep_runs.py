"""Sweep runs as the performance model reads them, through :mod:`workbench.runs` only.

:mod:`workbench.runs` is the one reader of MLflow runs (warm-up, one run per point, the baseline
rule); this module adapts its records to what ``wb project`` needs: per-run means after warm-up
(:class:`SweepRun`), the keys the engine microbenchmark groups runs by (:func:`config_key`,
:func:`workload_key`), the metrics a prediction needs (:func:`missing_metrics`), and the mean stage
times of one run for a projection (:func:`stages_from_mlflow`). Seconds are means per GRPO step.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.runs import POS_PREFIX, RunNotFound, RunReader
from workbench.runs import baseline_for as _baseline_for

# The stages a projection reads from a run (docs/design.md §3), in the order `wb project` prints them.
STAGES = ("data", "prepare", "gen", "logprob", "train", "draft_train")
POS_KEY = POS_PREFIX  # spec/acceptance_rate_pos_<i>
# What a prediction needs of every run (a speculative one also spec/num_drafts and its per-position rates).
REQUIRED = ("timing_s/gen", "timing_s/step", "gen/num_tokens")


@dataclass
class SweepRun:
    """One child run of a sweep: params, means after warm-up of its metrics (workbench.runs.RunRecord.mean)."""

    run_id: str
    name: str
    status: str
    params: dict[str, str]
    means: dict[str, float]

    @property
    def kind(self) -> str:
        return self.params.get("drafter.kind", "none")

    @property
    def is_baseline(self) -> bool:
        return self.kind == "none"

    @property
    def k(self) -> int:
        return 0 if self.is_baseline else int(self.params.get("drafter.k", 0) or 0)

    def _int(self, key: str, default: int) -> int:
        try:
            return int(self.params.get(key, default))
        except (TypeError, ValueError):
            return default

    @property
    def rows(self) -> int:
        """Rollouts per GRPO step: prompts_per_step × group_size."""
        return self._int("grpo.prompts_per_step", 8) * self._int("grpo.group_size", 8)

    @property
    def chunk(self) -> int:
        return min(self.rows, self._int("rollout.max_batch_size", 256))

    @property
    def continuous(self) -> bool:
        """rollout.continuous_batching (runs logged before it existed decoded in chunks)."""
        return str(self.params.get("rollout.continuous_batching", "False")).lower() == "true"

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk)

    @property
    def per_pos(self) -> list[float]:
        return [self.means[f"{POS_KEY}{i}"] for i in range(self.k) if f"{POS_KEY}{i}" in self.means]

    @property
    def gen(self) -> float | None:
        return self.means.get("timing_s/gen")

    @property
    def step(self) -> float | None:
        return self.means.get("timing_s/step")

    def label(self) -> str:
        return "baseline (none)" if self.is_baseline else f"{self.kind} k={self.k}"


def config_key(params: dict[str, str]) -> str:
    """What the engine microbenchmark measures for a run: target (+ dtype, device), drafter kind,
    its model or n-gram window, k. ``tiny none`` / ``tiny draft_model(tiny-draft) k=3`` / ``tiny ngram(1..4) k=3``."""
    tgt = params.get("model.target", "?")
    extra = [v for key, v in (("model.dtype", "float32"), ("model.device", "auto")) if params.get(key, v) != v]
    head = " ".join([tgt, *extra])
    kind = params.get("drafter.kind", "none")
    if kind == "none":
        return f"{head} none"
    detail = {"draft_model": f"({params.get('drafter.model', '?')})",
              "ngram": f"({params.get('drafter.prompt_lookup_min', '?')}..{params.get('drafter.prompt_lookup_max', '?')})"}.get(kind, "")
    return f"{head} {kind}{detail} k={params.get('drafter.k', '?')}"


WORKLOAD_KEYS = ("model.target", "task.name", "task.path", "rollout.temperature", "rollout.top_p", "rollout.top_k",
                 "rollout.max_new_tokens", "grpo.prompts_per_step", "grpo.group_size", "seed")


def workload_key(params: dict[str, str]) -> str:
    """What the completion lengths depend on: target, task, sampling, batch shape."""
    return " ".join(f"{key.split('.')[-1]}={params.get(key, '-')}" for key in WORKLOAD_KEYS)


def baseline_for(run: SweepRun, runs: list[SweepRun]) -> SweepRun | None:
    """The autoregressive baseline of ``run`` by the one rule of :func:`workbench.runs.baseline_for`:
    FINISHED, ``drafter.kind=none``, identical params except ``drafter.*``, ``tracking.*``,
    ``measure.*`` and ``name``; None when the sweep has none of that setting."""
    return _baseline_for(run, runs)


def load_sweep(name: str, tracking_uri: str | None = None) -> tuple[list[SweepRun], str]:
    """The child runs of sweep ``name`` (newest parent tagged ``workbench.sweep`` = name), read by
    :class:`workbench.runs.RunReader` (one run per point: a resumed point's FINISHED run wins), with
    the means after warm-up (:meth:`workbench.runs.RunRecord.mean`) of their ``timing_s/*``,
    ``gen/num_tokens`` and ``spec/*`` metrics. Returns (runs, tracking URI).

    Raises:
        ValueError: no such sweep (the message lists the sweeps in the store).
    """
    reader = RunReader(tracking_uri)
    parent = reader.find_parent("workbench.sweep", name, "workbench.sweep.role")
    if parent is None:
        parents = reader.top_level("tags.`workbench.sweep.role` = 'parent'")
        names = list(dict.fromkeys(p.data.tags.get("workbench.sweep", "") for p in parents))
        raise ValueError(f"--sweep: no sweep named {name!r} in {reader.uri}; sweeps there: {', '.join(n for n in names if n) or '(none)'}"
                         " (set the store with --tracking-uri or $MLFLOW_TRACKING_URI)")
    runs = []
    for r in reader.children(parent.info.run_id, [parent.info.experiment_id]):
        keys = [key for key in r.history if key.startswith(("timing_s/", "spec/", "gen/num_tokens"))]
        means = {key: m for key in keys if (m := r.mean(key)) is not None}
        runs.append(SweepRun(r.run_id, r.name, r.status, dict(r.params), means))
    runs.sort(key=lambda x: (not x.is_baseline, x.kind, x.k))
    return runs, reader.uri


def missing_metrics(run: SweepRun) -> list[str]:
    need = list(REQUIRED) + ([] if run.is_baseline else ["spec/num_drafts"] + [f"{POS_KEY}{i}" for i in range(run.k)])
    return [k for k in need if k not in run.means]


def stages_from_mlflow(run: str, tracking_uri: str | None = None, skip_first: bool = True) -> tuple[dict[str, float], dict]:
    """Mean ``timing_s/<stage>`` and the acceptance information of an MLflow run given by id or run
    name, read by :class:`workbench.runs.RunReader`. Means are :meth:`workbench.runs.RunRecord.mean`
    (the run's ``measure.warmup_steps`` left out); ``skip_first=False`` keeps every step.

    Returns (stages, info) with info keys ``drafter``, ``k``, ``per_pos`` (list of rates),
    ``acceptance_length``. ``other`` holds ``timing_s/other`` when logged.
    """
    try:
        r = RunReader(tracking_uri).get(run)
    except RunNotFound as e:
        raise ValueError(f"--run: {e}") from None

    def mean(key: str) -> float | None:
        if skip_first:
            return r.mean(key)
        vals = r.series(key, warmup=False)
        return sum(vals) / len(vals) if vals else None

    stages = {}
    for st in STAGES + ("reward", "other"):
        v = mean(f"timing_s/{st}")
        if v is not None:
            stages[st] = v
    if "gen" not in stages:
        raise ValueError(f"--run {run}: no timing_s/gen metric")
    k = int(r.params.get("drafter.k", 0) or 0)
    per_pos = [mean(f"spec/acceptance_rate_pos_{i}") for i in range(k)]
    info = dict(drafter=r.params.get("drafter.kind", "drafter"), k=k,
                per_pos=[p for p in per_pos if p is not None], acceptance_length=mean("spec/acceptance_length"))
    return stages, info
