"""reasoning-gym's procedural math tasks with the workbench's boxed-answer instruction.

Example item (``generate(1, 0, "chain_sum", max_terms=3, max_digits=2)``):
    prompt:   "State the final answer to the following arithmetic problem: 15 - 43 - 75 =
               Put the final answer in \\boxed{}."
    answer:   "-103"

Each item is a reasoning-gym entry (github.com/open-thought/reasoning-gym, ``pip install
reasoning-gym==0.1.25``, the ``[real]`` extra): its ``question`` followed by math_word's
``INSTRUCTION`` (the same words, so the boxed format reward means the same on every math task), and
its ``answer`` string as the gold answer for math-verify (workbench.tasks.math_reward).
``generate(n, seed, dataset, **config)`` is ``reasoning_gym.create_dataset(dataset, size=n,
seed=seed, **config)``: entry ``i`` is drawn from ``Random(seed + i)`` (gsm_symbolic also picks its
template from ``Random(seed).choices``), so items are deterministic for (n, seed, dataset, config)
and prefix-stable in n, as the workbench's own generators are; train and eval are then split by the
prompt's hash (workbench.tasks.loading), so no held-out prompt appears in training.

Registered tasks (workbench.tasks.TASKS): ``gsm_symbolic`` (GSM-Symbolic's 85 GSM8K templates with
fresh numbers: multi-step school word problems) and ``chain_sum`` (a chain of + and - on whole
numbers, reasoning-gym's default 2-6 terms of 1-4 digits) and ``chain_sum_1digit`` (two terms of one
digit: the first level of reasoning-gym's own chain_sum curriculum, and the only configuration measured
where SmolLM2-135M-Instruct gets a fair share right: docs/results/reasoning-gym-tasks.md). Its support is
small (200 expressions, 10 of them held out by hash): its eval repeats those 10 prompts. reasoning-gym is imported
on first use: without it, asking for these tasks' data raises a ValueError naming the install command.
"""

from __future__ import annotations

from functools import lru_cache

from data.math_word import INSTRUCTION

# bump when this wrapper changes what it yields: invalidates cached data. The data also depends on
# reasoning-gym's own generators, which is why the [real] extra pins its version.
VERSION = 1
REASONING_GYM_VERSION = "0.1.25"
INSTALL = 'pip install -e ".[real]"'

# the configurations registered as tasks: task name -> (reasoning-gym dataset, its config keywords)
CONFIGS: dict[str, tuple[str, dict]] = {
    "gsm_symbolic": ("gsm_symbolic", {}),
    "chain_sum": ("chain_sum", {}),
    "chain_sum_1digit": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
}


@lru_cache(maxsize=1)
def reasoning_gym():
    """The ``reasoning_gym`` module (imported on first use, ~1.5 s). Raises ValueError naming the
    install command if it is not installed."""
    try:
        import reasoning_gym as rg
    except ImportError:
        raise ValueError(
            f"the reasoning-gym tasks need reasoning-gym: {INSTALL} "
            f"(or pip install reasoning-gym=={REASONING_GYM_VERSION})"
        ) from None
    return rg


def dataset(name: str, n: int, seed: int, **config):
    """reasoning-gym's ``create_dataset(name, size=n, seed=seed, **config)`` (n >= 1)."""
    return reasoning_gym().create_dataset(name, size=n, seed=seed, **config)


def make_item(entry: dict, index: int) -> dict:
    """The workbench item of one reasoning-gym entry: question + INSTRUCTION, answer = its answer string."""
    return {
        "prompt": f"{entry['question'].rstrip()} {INSTRUCTION}",
        "answer": str(entry["answer"]).strip(),
        "question": entry["question"],
        "index": index,
    }


def generate(n: int, seed: int, dataset_name: str = "gsm_symbolic", **config) -> list[dict]:
    """n items of reasoning-gym's ``dataset_name`` with ``config``, deterministic for (n, seed, dataset,
    config) and prefix-stable in n. Raises ValueError if reasoning-gym is missing."""
    if n <= 0:
        reasoning_gym()  # the same error without reasoning-gym, whatever n
        return []
    ds = dataset(dataset_name, n, seed, **config)
    return [make_item(ds[i], i) for i in range(n)]


def task_generate(task_name: str):
    """The ``generate(n, seed)`` of a registered configuration (see CONFIGS)."""
    name, config = CONFIGS[task_name]

    def gen(n: int, seed: int) -> list[dict]:
        return generate(n, seed, name, **config)

    gen.__name__ = f"generate_{task_name}"
    gen.__doc__ = (
        f"reasoning-gym {name} {config or '(default config)'}: n items for seed (see data.reasoning_gym_tasks.generate)"
    )
    return gen
