"""The reward stage: a list of TRL reward functions, each logged, and their weighted sum.

    r = score(task, completions, answers, format_weight=0.5)    # a task's own rewards
    r = score(spec_reward_funcs(spec.task), completions, columns={"solution": [...]}, prompts=[...])
    r.total          # (N,) the reward GRPO's advantages are computed from
    r.metrics()      # {"reward/accuracy": mean, "reward/format": mean} or {"reward/<func name>": mean}

As TRL's GRPOTrainer with several ``reward_funcs`` and ``reward_weights``: each function is called
as TRL calls it (``func(prompts=, completions=, completion_ids=, **columns, trainer_state=, log_extra=,
log_metric=)``, workbench.tasks.reward_funcs) and logged on its own (TRL: ``rewards/<name>/mean``;
here ``reward/<name>``), the advantage sees the weighted sum. None ("not applicable") is NaN, left out
of that function's mean and of the sum (TRL's ``nansum``; a row every function skips sums to 0).
Weight 0 logs a reward without training on it. The registered tasks' rewards are functions of the
same form (workbench.tasks.rewards): one scoring path.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from workbench import metrics as M
from workbench.models.chat import parse_messages
from workbench.stats import wilson
from workbench.tasks import Task
from workbench.tasks.reward_funcs import RewardFunc, task_reward_funcs


class RewardFunctionError(ValueError):
    """A reward function raised, or returned something other than one number (or None) per completion;
    the message names the function (its ``task.reward`` reference) and what went wrong."""


@dataclass(frozen=True)
class RewardState:
    """What a reward function gets as ``trainer_state`` (TRL passes its ``TrainerState``): optimiser
    steps taken so far and the run's total."""

    global_step: int
    max_steps: int


@dataclass
class Scores:
    """Each reward function's values, (N,) lists with NaN where it returned None, keyed by metric name
    (a task's own: ``accuracy``, ``format``, ``last_number``; else the functions' names), their weights,
    the weighted NaN-sum ``total`` (N,), and the scalars functions logged through ``log_metric``."""

    values: dict[str, list[float]]
    weights: dict[str, float]
    total: list[float]
    logged: dict[str, float] = field(default_factory=dict)

    @property
    def accuracy(self) -> list[float] | None:
        """(N,) the task's verifier: 1.0 correct, 0.0 not (None with ``task.reward`` functions instead)."""
        return self.values.get("accuracy")

    @property
    def format(self) -> list[float] | None:
        """(N,) 1.0 in the asked-for format; None when the task has no format reward."""
        return self.values.get("format")

    @property
    def last_number(self) -> list[float] | None:
        """(N,) the task's anchor-free check (logged only), None without one."""
        return self.values.get("last_number")

    def metrics(self, prefix: str = M.REWARD, ci: bool = False) -> dict[str, float]:
        """Means over the rows each function scored (None rows left out, as TRL's ``nanmean``):
        ``<prefix>/<name>`` (``reward/accuracy``, ``reward/format``, ``reward/last_number`` for a task's own);
        ``ci``: also Wilson 95 % intervals (``_ci95_low`` / ``_ci95_high``) of functions whose values are all
        0 or 1. A function that scored no row logs nothing; ``log_metric`` scalars: ``<prefix>/<name>``."""
        m: dict[str, float] = {}
        for name, vals in self.values.items():
            vals = [v for v in vals if not math.isnan(v)]
            if not vals:
                continue
            m[M.reward_key(prefix, name)] = sum(vals) / len(vals)
            if ci and all(v in (0.0, 1.0) for v in vals):
                m[M.reward_key(prefix, f"{name}_ci95_low")], m[M.reward_key(prefix, f"{name}_ci95_high")] = (
                    wilson_interval(int(sum(vals)), len(vals))
                )
        m.update({M.reward_key(prefix, k): v for k, v in self.logged.items() if k not in self.values})
        return m


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: :func:`workbench.stats.wilson` (one implementation,
    shared with the report's held-out accuracy table).

    Raises ValueError if n < 1 or successes is outside 0..n.
    """
    return wilson(successes, n, confidence)


def score(
    rewards: Task | list[RewardFunc],
    completions: list,
    answers: list[str] | None = None,
    format_weight: float = 0.0,
    *,
    prompts: list | None = None,
    completion_ids: list[list[int]] | None = None,
    columns: dict[str, list] | None = None,
    trainer_state: Any = None,
) -> Scores:
    """Score N completions with every reward function, as TRL's ``GRPOTrainer._calculate_rewards``.

    Args:
        rewards: a registered task (its own rewards, ``format_weight`` the format reward's weight) or the
            run's functions (workbench.tasks.reward_funcs.spec_reward_funcs).
        completions: (N,) the assistant's text, or TRL conversational ``[{"role": "assistant", "content"}]``.
        answers: (N,) gold answers, passed as the ``answer`` column (may be None when ``columns`` has what
            the functions read).
        prompts: (N,) each row's prompt (a string or its messages); default "" each.
        completion_ids: (N,) each completion's token ids (EOS included when emitted); default [] each.
        columns: dataset columns, each (N,), passed by name (TRL: every column but ``prompt``).
        trainer_state: passed as ``trainer_state`` (:class:`RewardState` in a run).

    Returns:
        :class:`Scores`; ``total[i]`` = sum over functions j of weight_j * value_ij, None values skipped.

    Raises:
        ValueError: lists of different lengths, or ``format_weight`` > 0 for a task without a format
            reward (naming task.format_reward).
        RewardFunctionError: a ``task.reward`` function raised, or returned other than N numbers or None
            (names it). A task's own functions' exceptions propagate unchanged.
    """
    n = len(completions)
    cols = dict(columns or {})
    if answers is not None:
        cols.setdefault("answer", list(answers))
    for name, vals in cols.items():
        if len(vals) != n:
            raise ValueError(f"score: {n} completions but {len(vals)} values in column {name!r}")
    funcs = task_reward_funcs(rewards, format_weight) if isinstance(rewards, Task) else list(rewards)
    logged: dict[str, list[float]] = {}
    kwargs = {
        "prompts": list(prompts) if prompts is not None else [""] * n,
        "completions": list(completions),
        "completion_ids": list(completion_ids) if completion_ids is not None else [[] for _ in range(n)],
        **cols,
        "trainer_state": trainer_state,
        "log_extra": lambda column, values: None,  # TRL's completions-table columns: not kept here
        "log_metric": lambda name, value: logged.setdefault(str(name), []).append(float(value)),
    }
    values = {f.name: _call(f, kwargs, n) for f in funcs}
    total = [
        sum(f.weight * values[f.name][i] for f in funcs if f.weight and not math.isnan(values[f.name][i]))
        for i in range(n)
    ]
    return Scores(values, {f.name: f.weight for f in funcs}, [float(t) for t in total], _means(logged))


def _means(logged: dict[str, list[float]]) -> dict[str, float]:
    return {k: sum(v) / len(v) for k, v in logged.items() if v}


def _call(f: RewardFunc, kwargs: dict[str, Any], n: int) -> list[float]:
    """``f.func(**kwargs)`` (only the arguments it names when it takes no ``**kwargs``), checked: N values,
    each a real number or None (-> NaN)."""
    try:
        params = inspect.signature(f.func).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        pass
    if f.ref is None:  # a task's own: its errors are the workbench's, unchanged
        out = f.func(**kwargs)
    else:
        try:
            out = f.func(**kwargs)
        except Exception as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise RewardFunctionError(f"task.reward: reward function {f.ref} raised {type(e).__name__}: {msg}") from e
    try:
        out = list(out)
    except TypeError:
        raise RewardFunctionError(
            f"task.reward: reward function {f.label} returned {type(out).__name__}, not a list of {n} floats; "
            "return one float (or None) per completion"
        ) from None
    if len(out) != n:
        raise RewardFunctionError(
            f"task.reward: reward function {f.label} returned {len(out)} rewards for {n} completions; "
            "return one float (or None) per completion, in the completions' order"
        )
    vals = []
    for v in out:
        if v is None:
            vals.append(math.nan)
        elif isinstance(v, numbers.Real) or (hasattr(v, "item") and getattr(v, "ndim", 1) == 0):
            vals.append(float(v))
        else:
            raise RewardFunctionError(
                f"task.reward: reward function {f.label} returned {v!r} ({type(v).__name__}) among its rewards; "
                "each must be a float (or None: not applicable)"
            )
    return vals


def row_prompt(prompt: Any) -> Any:
    """A row's prompt as TRL passes it to reward functions: its messages if conversational (the workbench
    stores those as JSON text, workbench.tasks.loading), else the string."""
    return (parse_messages(prompt) or prompt) if isinstance(prompt, str) else prompt


def score_rows(
    funcs: list[RewardFunc],
    rows: list[dict],
    group_size: int,
    texts: list[str],
    completion_ids: list[list[int]],
    trainer_state: Any = None,
) -> Scores:
    """:func:`score` for a step's rollouts: ``rows`` (P,) dataset rows, each repeated ``group_size`` times
    for the N = P * G completions ``texts`` (N,) and their token ids (N,). As TRL: completions are message
    lists when the prompts are conversational (a list of messages), strings otherwise; every column but
    ``prompt`` is passed by name. Raises as :func:`score`."""
    prompts = [row_prompt(r["prompt"]) for r in rows for _ in range(group_size)]
    conversational = bool(prompts) and isinstance(prompts[0], list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
    keys = [k for k in (rows[0] if rows else {}) if k not in ("prompt", "completion", "completion_ids")]
    columns = {k: [r[k] for r in rows for _ in range(group_size)] for k in keys}
    return score(
        funcs, completions, prompts=prompts, completion_ids=completion_ids, columns=columns, trainer_state=trainer_state
    )
