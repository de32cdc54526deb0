"""Sweep runs as the performance model reads them, through :mod:`workbench.runs` only.

:mod:`workbench.runs` is the one reader of MLflow runs (warm-up, one run per point, the baseline
rule); this module adapts its records to what the performance model needs: per-run means after warm-up
(:class:`SweepRun`), the mean stage times of one run for a projection (:func:`stages_from_mlflow`,
``wb project --run``) and a run's spec rebuilt from its params (:func:`spec_from_params`). Seconds
are means per GRPO step.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import metrics as M
from workbench.runs import RunNotFound, RunReader

# The stages a projection reads from a run (docs/design.md §3), in the order `wb project` prints them.
STAGES = ("data", "prepare", "gen", "logprob", "train", "draft_train")


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
    def per_pos(self) -> list[float]:
        return [self.means[M.acceptance_rate_pos(i)] for i in range(self.k) if M.acceptance_rate_pos(i) in self.means]


def stages_from_mlflow(
    run: str, tracking_uri: str | None = None, skip_first: bool = True
) -> tuple[dict[str, float], dict]:
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
        v = mean(M.timing(st))
        if v is not None:
            stages[st] = v
    if "gen" not in stages:
        raise ValueError(f"--run {run}: no timing_s/gen metric")
    k = int(r.params.get("drafter.k", 0) or 0)
    per_pos = [mean(M.acceptance_rate_pos(i)) for i in range(k)]
    info = dict(
        drafter=r.params.get("drafter.kind", "drafter"),
        k=k,
        per_pos=[p for p in per_pos if p is not None],
        acceptance_length=mean(M.ACCEPTANCE_LENGTH),
    )
    return stages, info


def spec_from_params(params: dict[str, str]):
    """An ExperimentSpec from a run's flat dotted params (keys the current spec lacks are ignored)."""
    import yaml

    from workbench.specs import ExperimentSpec

    d = ExperimentSpec().model_dump(mode="json")
    for key, raw in params.items():
        node, parts = d, key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if parts[0] == "tracking" or not isinstance(node, dict) or parts[-1] not in node:
            continue
        if raw == "None" or isinstance(node[parts[-1]], str):
            v = None if raw == "None" else raw
        else:
            try:
                v = yaml.safe_load(raw)
            except yaml.YAMLError:
                v = raw
        node[parts[-1]] = v
    return ExperimentSpec.model_validate(d)
