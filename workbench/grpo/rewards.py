"""The reward stage: a task's accuracy reward, its optional format reward, their weighted sum.

    r = score(task, completions, answers, format_weight=0.5)
    r.total          # (N,) the reward GRPO's advantages are computed from
    r.metrics()      # {"reward/accuracy": mean, "reward/format": mean}

As TRL's GRPOTrainer with several ``reward_funcs`` and ``reward_weights``: each function is
logged on its own (TRL: ``rewards/<name>/mean``), the advantage sees the weighted sum. Weight 0
logs the format reward without training on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import metrics as M
from workbench.stats import wilson
from workbench.tasks import Task


@dataclass
class Scores:
    accuracy: list[float]  # (N,) the task's verifier: 1.0 correct, 0.0 not
    format: list[float] | None  # (N,) 1.0 in the asked-for format; None when the task has no format reward
    total: list[float]  # (N,) accuracy + format_weight * format
    last_number: list[float] | None = None  # (N,) the task's anchor-free check (logged only), None without one

    def metrics(self, prefix: str = M.REWARD, ci: bool = False) -> dict[str, float]:
        """Means over the rows: ``<prefix>/accuracy`` and, if the task has them, ``<prefix>/format`` and
        ``<prefix>/last_number`` (the anchor-free check);
        ``ci``: also their Wilson 95 % intervals (``_ci95_low`` / ``_ci95_high``; binary rewards only)."""
        m: dict[str, float] = {}
        for name, vals in (("accuracy", self.accuracy), ("format", self.format), ("last_number", self.last_number)):
            if vals is None:
                continue
            m[M.reward_key(prefix, name)] = sum(vals) / max(len(vals), 1)
            if ci and vals:
                m[M.reward_key(prefix, f"{name}_ci95_low")], m[M.reward_key(prefix, f"{name}_ci95_high")] = (
                    wilson_interval(int(sum(vals)), len(vals))
                )
        return m


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: :func:`workbench.stats.wilson` (one implementation,
    shared with the report's held-out accuracy table).

    Raises ValueError if n < 1 or successes is outside 0..n.
    """
    return wilson(successes, n, confidence)


def score(task: Task, completions: list[str], answers: list[str], format_weight: float = 0.0) -> Scores:
    """Score N completion texts (the assistant's text only) against their gold answers.

    Raises ValueError if the lists differ in length, or if ``format_weight`` > 0 for a task
    without a format reward (naming task.format_reward).
    """
    if len(completions) != len(answers):
        raise ValueError(f"score: {len(completions)} completions but {len(answers)} answers")
    if format_weight > 0 and task.format_reward is None:
        raise ValueError(f"task.format_reward: task {task.name!r} has no format reward; set task.format_reward=0")
    acc = [float(task.reward(c, a)) for c, a in zip(completions, answers)]
    fmt = [float(task.format_reward(c)) for c in completions] if task.format_reward is not None else None
    total = acc if not format_weight else [a + format_weight * f for a, f in zip(acc, fmt)]
    last = (
        [float(task.anchor_free(c, a)) for c, a in zip(completions, answers)] if task.anchor_free is not None else None
    )
    return Scores(acc, fmt, total, last)
