"""Task registry: a verifiable task = a data generator + a reward verifier.

    task = get_task("arith_chain")
    items = task.generate(n, seed)                # [{"prompt", "answer", ...}, ...]
    task.reward(completion_text, answer)          # 1.0 if correct else 0.0

Datasets for training/eval come from `load_task_data` (generated or a user's jsonl/parquet file),
general "chat" prompts from `load_general_prompts`; both return `datasets.Dataset`s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Callable

from data import arith_chain, math_word, reasoning_gym_tasks
from workbench.tasks.math_reward import boxed_format_reward, last_number_reward, math_accuracy_reward


@dataclass
class Task:
    name: str
    generate: Callable[[int, int], list[dict]]  # (n, seed) -> items with at least "prompt", "answer"
    reward: Callable[[str, str], float]  # (completion text, gold answer) -> reward in [0, 1]
    description: str
    version: int = 1  # data version: part of cache keys, bump when `generate` changes
    # (completion text) -> 1.0 if it is in the format the prompt asks for; logged as reward/format and
    # added to the reward with weight task.format_reward (None: the task has no format reward)
    format_reward: Callable[[str], float] | None = None
    # (completion text, gold answer) -> 1.0 if the last number in the text is the answer: an anchor-free
    # check logged beside the reward (reward/last_number, eval/last_number), never trained on
    anchor_free: Callable[[str, str], float] | None = None


_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")


def parse_answer(completion: str) -> int | None:
    """The integer after the LAST "Answer:" in completion, or None if there is none."""
    matches = _ANSWER_RE.findall(completion)
    return int(matches[-1]) if matches else None


def answer_reward(completion: str, answer: str) -> float:
    """1.0 if the last "Answer: <int>" in completion equals the integer answer, else 0.0.

    A missing answer, or a gold answer that is not an integer, gives 0.0 (never raises), so a
    malformed rollout can't crash an RL step.
    """
    got = parse_answer(completion)
    if got is None:
        return 0.0
    try:
        return 1.0 if got == int(str(answer).strip()) else 0.0
    except ValueError:
        return 0.0


def _reasoning_gym_task(name: str, what: str) -> Task:
    """A reasoning-gym configuration (data/reasoning_gym_tasks.py) as a task: math-verify accuracy + boxed format."""
    return Task(
        name=name,
        generate=reasoning_gym_tasks.task_generate(name),
        reward=math_accuracy_reward,
        description=f"{what}; reward = math-verify accuracy (+ format)",
        version=reasoning_gym_tasks.VERSION,
        format_reward=boxed_format_reward,
        anchor_free=last_number_reward,
    )


TASKS: dict[str, Task] = {
    "arith_chain": Task(
        name="arith_chain",
        generate=arith_chain.generate,
        reward=answer_reward,
        description="evaluate a 3-6 step + - * chain left to right, writing each step; reward = exact final answer",
        version=arith_chain.VERSION,
    ),
    # The long-tail workload: 1-16 operations, so completion lengths spread ~9x
    # (about 15 to 140 tokens) and, as in reasoning RL, a few rows decode alone at the end of a step.
    "arith_chain_long": Task(
        name="arith_chain_long",
        generate=partial(arith_chain.generate, min_ops=1, max_ops=16),
        reward=answer_reward,
        description="arith_chain with 1-16 steps: a long tail of completion lengths (the tail decodes nearly alone)",
        version=arith_chain.VERSION,
    ),
    # A pretrained chat model's task: word problems with a boxed answer, rewarded by
    # math-verify as TRL/open-r1 do; user files in the GSM8K and DAPO-Math layouts load under it too.
    "math_word": Task(
        name="math_word",
        generate=math_word.generate,
        reward=math_accuracy_reward,
        description="1-3 step arithmetic word problems, answer in \\boxed{}; reward = math-verify accuracy (+ format)",
        version=math_word.VERSION,
        format_reward=boxed_format_reward,
        anchor_free=last_number_reward,
    ),
    # One operation: what a ~100M chat model can partly solve (docs/results/real-model.md)
    "math_word_1": Task(
        name="math_word_1",
        generate=partial(math_word.generate, min_ops=1, max_ops=1),
        reward=math_accuracy_reward,
        description="math_word with one operation; reward = math-verify accuracy (+ format)",
        version=math_word.VERSION,
        format_reward=boxed_format_reward,
        anchor_free=last_number_reward,
    ),
    # reasoning-gym's procedural maths (data/reasoning_gym_tasks.py, the [real] extra):
    # its question + math_word's boxed-answer instruction, its answer string scored by math-verify.
    # Baselines of SmolLM2-135M-Instruct: docs/results/reasoning-gym-tasks.md
    "gsm_symbolic": _reasoning_gym_task(
        "gsm_symbolic", "reasoning-gym gsm_symbolic: GSM8K templates with fresh numbers, answer in \\boxed{}"
    ),
    "chain_sum": _reasoning_gym_task(
        "chain_sum", "reasoning-gym chain_sum: 2-6 whole numbers of 1-4 digits joined by + and -, answer in \\boxed{}"
    ),
    # two one-digit terms (reasoning-gym's chain_sum curriculum, level 0): 200 expressions, 10 held out
    "chain_sum_1digit": _reasoning_gym_task(
        "chain_sum_1digit", "reasoning-gym chain_sum with two one-digit numbers (a + b or a - b), answer in \\boxed{}"
    ),
}


def get_task(name: str) -> Task:
    """The registered task called name. Raises ValueError naming task.name and the allowed values."""
    if name not in TASKS:
        raise ValueError(f"task.name: unknown task {name!r}; allowed values: {', '.join(TASKS)}")
    return TASKS[name]


from workbench.tasks.loading import is_eval_prompt, load_general_prompts, load_task_data  # noqa: E402

__all__ = [
    "Task",
    "TASKS",
    "get_task",
    "answer_reward",
    "parse_answer",
    "load_task_data",
    "load_general_prompts",
    "is_eval_prompt",
]
