"""Reward functions with TRL's signature, used by the examples by reference (``task.reward: my_rewards:...``).

TRL calls ``reward_func(prompts=..., completions=..., completion_ids=..., **columns)`` with every dataset
column as a keyword argument and expects one float (or None: not applicable) per completion.
"""

from __future__ import annotations

import re


def _text(completion) -> str:
    """A completion as text: a string, or TRL's conversational form (a list of messages)."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def exact_number(prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
    """1.0 when the last integer in the completion equals the row's ``answer`` column, else 0.0."""
    out = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", _text(completion))
        out.append(1.0 if numbers and numbers[-1] == str(gold).strip() else 0.0)
    return out


def brevity(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """A small shaping reward in [0, 1]: shorter completions score higher (1 / (1 + tokens / 16))."""
    return [1.0 / (1.0 + len(ids) / 16) for ids in completion_ids]
