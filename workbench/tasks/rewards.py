"""The built-in tasks' rewards as TRL reward functions: the one form every reward takes in the workbench.

    from workbench.tasks.rewards import math_accuracy
    math_accuracy(prompts=["2+2?"], completions=["\\\\boxed{4}"], completion_ids=[[]], answer=["4"])   # [1.0]

Each is called as TRL's ``GRPOTrainer`` calls a reward function of its ``reward_funcs``:
``func(prompts=..., completions=..., completion_ids=..., **columns)``, every list of length N (one per
completion), ``columns`` the dataset's columns (here the gold ``answer``) and ``trainer_state``; it returns
N floats. ``completions`` are strings for standard prompts or, for conversational ones, lists of messages
(``[{"role": "assistant", "content": ...}]``): both are read (:func:`completion_text`). So a task's reward is
usable in ``task.reward`` (``workbench.tasks.rewards:math_accuracy``) beside a user's or TRL's own
(``trl.rewards:accuracy_reward``), and :func:`builtin_form` maps a registered task's per-completion
verifier (``Task.reward``, ``format_reward``, ``anchor_free``) to its function here.
Source: TRL ``GRPOTrainer(reward_funcs=...)``, trl/trainer/grpo_trainer.py ``_calculate_rewards``.
"""

from __future__ import annotations

from typing import Any, Callable

from workbench.tasks import answer_reward
from workbench.tasks.math_reward import boxed_format_reward, last_number_reward, math_accuracy_reward


def completion_text(completion: Any) -> str:
    """A completion's text: the string itself (standard format) or its messages' contents joined
    (conversational format, TRL's ``[{"role": "assistant", "content": ...}]``)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion)


def _per_row(fn: Callable[[str, str], float], completions: list, answer: list) -> list[float]:
    if len(answer) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [float(fn(completion_text(c), a)) for c, a in zip(completions, answer)]


def arith_answer(completions: list, answer: list[str], **kwargs) -> list[float]:
    """arith_chain's reward: 1.0 where the last "Answer: <int>" equals ``answer`` (workbench.tasks.answer_reward).

    Args: completions (N,) strings or message lists; answer (N,) gold integers as strings; kwargs: the
    other columns, prompts, completion_ids, trainer_state (unused). Returns N floats in {0, 1}.
    Raises ValueError if the lengths differ.
    """
    return _per_row(answer_reward, completions, answer)


def math_accuracy(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The math tasks' reward: math-verify accuracy of the final answer against ``answer``
    (:func:`workbench.tasks.math_reward.math_accuracy_reward`). Args and lengths as :func:`arith_answer`.

    Raises ValueError (lengths differ, or math-verify missing: names the extra), RuntimeError off the main thread.
    """
    return _per_row(math_accuracy_reward, completions, answer)


def boxed_format(completions: list, **kwargs) -> list[float]:
    """The math tasks' format reward: 1.0 where the last ``\\boxed{...}`` holds a value
    (:func:`workbench.tasks.math_reward.boxed_format_reward`). completions (N,); returns N floats in {0, 1}."""
    return [float(boxed_format_reward(completion_text(c))) for c in completions]


def last_number(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The anchor-free check: 1.0 where the last number written equals ``answer``
    (:func:`workbench.tasks.math_reward.last_number_reward`). Args and lengths as :func:`arith_answer`."""
    return _per_row(last_number_reward, completions, answer)


# a task's per-completion verifier -> its TRL form (the registered tasks use these four)
_FORMS: dict[Callable, Callable] = {
    answer_reward: arith_answer,
    math_accuracy_reward: math_accuracy,
    boxed_format_reward: boxed_format,
    last_number_reward: last_number,
}


def builtin_form(fn: Callable[..., float], uses_answer: bool = True) -> Callable[..., list[float]]:
    """The TRL-signature function of a task's per-completion verifier ``fn`` (``(text, answer) -> float``,
    or ``(text) -> float`` when ``uses_answer`` is False): one of this module's, or a wrapper for a task
    registered with a verifier of its own."""
    if fn in _FORMS:
        return _FORMS[fn]

    def reward(completions: list, answer: list[str] | None = None, **kwargs) -> list[float]:
        if not uses_answer:
            return [float(fn(completion_text(c))) for c in completions]
        return _per_row(fn, completions, answer if answer is not None else [""] * len(completions))

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
