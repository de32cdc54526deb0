"""Completion lengths for the simulator: measured ones from a workbench run, or a grouped lognormal.

The rollout stage's length is set by its long tail (docs/design.md §3), and in GRPO the tail is grouped:
the G samples of one prompt share its difficulty, so their lengths are correlated. Two ways in:

- **Measured**: every `wb run` logs each step's per-row lengths, rows grouped by prompt
  (:mod:`workbench.grpo.completions`, artifact ``completions/lengths/step_<n>.json``).
  :func:`read_run_lengths` reads them; :class:`MeasuredLengths` resamples whole prompts' groups
  (the bootstrap that keeps the within-group correlation; Davison & Hinkley 1997, §3.8, resampling
  clusters), optionally rescaled to another mean (the shape transfers, a tiny model's scale does not).
- **Parametric**: :func:`grouped_lognormal` — log L = m + s·(√icc·u_prompt + √(1 − icc)·e_row), u and e
  standard normal, so every row is lognormal with the given mean and cv and the intraclass correlation
  of log lengths within a prompt is ``icc`` (icc = 0: independent rows, the earlier model).

:func:`icc_log` estimates that correlation from groups (one-way random-effects ICC(1); Shrout &
Fleiss 1979), so a measured run gives the parameter a cluster scenario can carry.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench import metrics as M
from workbench.grpo.completions import FORMAT


def icc_log(groups: np.ndarray) -> float:
    """Intraclass correlation of log lengths within groups, ICC(1) = (MSB − MSW) / (MSB + (G − 1)·MSW).

    Args:
        groups: (n_groups, G) lengths in tokens (≥ 1).

    Returns 0 for G = 1, fewer than 2 groups, or no spread at all; clipped to [0, 1].
    """
    y = np.log(np.asarray(groups, dtype=float))
    n, g = y.shape
    if g < 2 or n < 2:
        return 0.0
    means = y.mean(axis=1)
    msb = g * float(((means - y.mean()) ** 2).sum()) / (n - 1)
    msw = float(((y - means[:, None]) ** 2).sum()) / (n * (g - 1))
    if msb + (g - 1) * msw <= 0:
        return 0.0
    return float(min(max((msb - msw) / (msb + (g - 1) * msw), 0.0), 1.0))


def grouped_lognormal(
    prompts: int, group_size: int, mean: float, cv: float, icc: float, max_len: int, rng: np.random.Generator
) -> np.ndarray:
    """prompts × G lengths (tokens, 1..max_len), rows grouped by prompt: each lognormal with ``mean`` and
    ``cv`` (before the cut at ``max_len``), log lengths correlated ``icc`` within a prompt."""
    n = prompts * group_size
    if cv == 0:
        return np.clip(np.full(n, np.rint(mean)), 1, max_len).astype(np.int64)
    s2 = math.log(1 + cv**2)
    u = np.repeat(rng.standard_normal(prompts), group_size)  # the prompt's share, one draw per group
    e = rng.standard_normal(n)
    z = math.sqrt(icc) * u + math.sqrt(1 - icc) * e  # (n,) standard normal, corr icc within a group
    x = np.exp(math.log(mean) - s2 / 2 + math.sqrt(s2) * z)
    return np.clip(np.rint(x), 1, max_len).astype(np.int64)


@dataclass
class MeasuredLengths:
    """A run's (or several runs') completion lengths per GRPO step, rows grouped by prompt (tokens)."""

    group_size: int
    max_new_tokens: int
    steps: list[np.ndarray] = field(default_factory=list)  # each (rows,), rows [g*G:(g+1)*G] of prompt g
    source: str = ""
    origins: list[str] = field(default_factory=list)  # per step: "run <id>, <artifact path>"

    @property
    def groups(self) -> np.ndarray:
        """(n_groups, G): every step's groups stacked."""
        return np.concatenate([s.reshape(-1, self.group_size) for s in self.steps])

    @property
    def mean(self) -> float:
        return float(np.mean(self.groups))

    @property
    def cv(self) -> float:
        x = self.groups.astype(float)
        return float(x.std() / x.mean())

    @property
    def icc(self) -> float:
        return icc_log(self.groups)

    @property
    def clipped(self) -> float:
        """Share of rows at max_new_tokens."""
        return float(np.mean(self.groups >= self.max_new_tokens))

    def step_draws(self, draws: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``draws`` GRPO steps, each a measured step drawn with replacement (rows as measured)."""
        return [self.steps[i].copy() for i in rng.integers(0, len(self.steps), draws)]

    def resample(
        self,
        prompts: int,
        group_size: int,
        rng: np.random.Generator,
        mean: float | None = None,
        max_len: int | None = None,
    ) -> np.ndarray:
        """prompts × G lengths (tokens, (prompts·G,)), rows grouped by prompt. Each prompt is a measured group
        drawn with replacement; with the measured G, its rows as measured. With another G, a two-level
        bootstrap (Davison & Hinkley 1997, §3.8): the prompt's level is its measured group's mean log length,
        each row adds a deviation drawn from all groups' within-group deviations of log length (pooled,
        inflated by sqrt(G_m / (G_m − 1)) for the group mean they were taken from), so a prompt's rows can
        spread past the few measured ones. Scaled so the measured mean becomes ``mean`` (None: as measured),
        before the cut at ``max_len`` (None: the measured max_new_tokens, scaled): rows the run cut at its
        max_new_tokens land at that cap times the scale, and the mean after the cut can fall below ``mean``."""
        groups = self.groups
        pick = groups[rng.integers(0, len(groups), prompts)]  # (prompts, G_measured)
        if group_size == self.group_size:
            x = pick.reshape(-1).astype(float)
        else:
            logs = np.log(np.maximum(groups, 1).astype(float))
            gm = self.group_size
            dev = (logs - logs.mean(axis=1, keepdims=True)).reshape(-1) * (math.sqrt(gm / (gm - 1)) if gm > 1 else 0.0)
            level = np.log(np.maximum(pick, 1).astype(float)).mean(axis=1)  # (prompts,)
            x = np.exp(level[:, None] + rng.choice(dev, (prompts, group_size))).reshape(-1)
        scale = 1.0 if mean is None else mean / self.mean
        cap = max_len if max_len is not None else int(round(self.max_new_tokens * scale))
        return np.clip(np.rint(x * scale), 1, cap).astype(np.int64)

    def describe(self) -> str:
        return (
            f"{len(self.steps)} steps x {self.steps[0].size} rows, mean {self.mean:.1f} tokens, cv {self.cv:.2f}, "
            f"within-prompt ICC {self.icc:.2f}, {100 * self.clipped:.0f} % at max_new_tokens"
        )


class NoLengthsLogged(ValueError):
    """A run logged no completion lengths (it ran before the workbench logged them)."""


def parse_record(rec: dict, where: str) -> tuple[int, int, np.ndarray]:
    """(group_size, max_new_tokens, lengths (rows,), tokens ≥ 1) of one step's record.

    Raises:
        ValueError: not a completion-lengths record, or inconsistent; the message names ``where``.
    """
    try:
        if rec.get("format") != FORMAT:
            raise ValueError(f"format {rec.get('format')!r}, expected {FORMAT!r}")
        g, cap, raw = int(rec["group_size"]), int(rec["max_new_tokens"]), np.asarray(rec["lengths"], dtype=float)
        if raw.ndim != 1 or raw.size == 0:
            raise ValueError("lengths must be a non-empty list")
        if (raw < 1).any() or (raw != np.round(raw)).any():
            raise ValueError("lengths must be whole numbers of tokens ≥ 1")
        if g < 1 or raw.size % g:
            raise ValueError(f"{raw.size} lengths do not form groups of {g}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(
            f"{where}: not a completion-lengths record ({e}); re-run the experiment to log it again"
        ) from e
    return g, cap, raw.astype(np.int64)


def read_run_lengths(run_ids: list[str], tracking_uri: str) -> MeasuredLengths:
    """Every step's lengths logged by the runs ``run_ids`` (artifacts ``completions/lengths/``); ``origins``
    names each step's run and file.

    Raises:
        NoLengthsLogged: a run logged none (runs from before the workbench logged them: re-run).
        ValueError: records of different group sizes or max_new_tokens, or a corrupt record (the message
            names the run and file).
    """
    import tempfile

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per step's file is noise
    if not run_ids:
        raise ValueError("no run to read completion lengths from")
    client = MlflowClient(tracking_uri)
    out: MeasuredLengths | None = None
    for rid in run_ids:
        files = sorted(f.path for f in client.list_artifacts(rid, M.COMPLETION_LENGTHS_DIR) if f.path.endswith(".json"))
        if not files:
            raise NoLengthsLogged(
                f"run {rid} logged no completion lengths (completions/lengths/step_*.json): runs before the workbench "
                "logged them have none; re-run it (or give workload.response.kind: lognormal)"
            )
        with tempfile.TemporaryDirectory() as tmp:  # one download per run, removed after
            local = Path(client.download_artifacts(rid, M.COMPLETION_LENGTHS_DIR, dst_path=tmp))
            for path in files:
                where = f"run {rid}, {path}"
                try:
                    rec = json.loads((local / Path(path).name).read_text())
                except (OSError, json.JSONDecodeError) as e:
                    raise ValueError(f"{where}: unreadable ({e})") from e
                g, cap, x = parse_record(rec, where)
                if out is None:
                    out = MeasuredLengths(g, cap, source=", ".join(run_ids))
                elif (g, cap) != (out.group_size, out.max_new_tokens):
                    raise ValueError(
                        f"{where}: group_size {g}, max_new_tokens {cap}; earlier records {out.group_size}, "
                        f"{out.max_new_tokens}: one workload per source"
                    )
                out.steps.append(x)
                out.origins.append(where)
    return out  # type: ignore[return-value]  (run_ids non-empty: set above or raised)
