"""math_word: short arithmetic word problems with a boxed answer, for pretrained chat models.

Example item:
    prompt:   "Mia has 7 apples. She buys 5 more apples. How many apples does Mia have now?
               Put the final answer in \\boxed{}."
    solution: "Mia has 7 + 5 = 12 apples. The answer is \\boxed{12}."
    answer:   "12"

One to three operations (+, -, x, / by small numbers) on small whole numbers, each a sentence of a
story about one person and one kind of item, so a ~100M-parameter instruct model (SmolLM2-135M)
solves some but not all of them: GRPO has signal. The instruction to box the answer is the one
DeepSeek-R1 / open-r1 use for math ("put your final answer within \\boxed{}"), and the reward is
math-verify's (workbench.tasks.math_reward). Every intermediate value stays in 0..MAX_VALUE and
every division is exact.
"""

from __future__ import annotations

import random

VERSION = 1  # bump when the generator changes: invalidates cached data
INSTRUCTION = "Put the final answer in \\boxed{}."
MAX_VALUE = 60
NAMES = [
    ("Mia", "She"),
    ("Leo", "He"),
    ("Ava", "She"),
    ("Sam", "He"),
    ("Zoe", "She"),
    ("Max", "He"),
    ("Lily", "She"),
    ("Ben", "He"),
    ("Emma", "She"),
    ("Noah", "He"),
    ("Ella", "She"),
    ("Tom", "He"),
]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells", "cards", "coins"]


def _start(rng: random.Random, name: str, item: str) -> tuple[str, int, str]:
    """The opening sentence: (text, value, worked step)."""
    if rng.random() < 0.3:  # bags of items: a product to start with
        a, b = rng.randint(2, 5), rng.randint(2, 6)
        return f"{name} has {a} bags with {b} {item} in each bag.", a * b, f"{a} x {b} = {a * b}"
    a = rng.randint(2, 20)
    return f"{name} has {a} {item}.", a, str(a)


def _event(rng: random.Random, x: int, pron: str, item: str) -> tuple[str, int, str]:
    """One legal operation on value x (0..MAX_VALUE): (sentence, new value, worked step)."""
    obj = "her" if pron == "She" else "him"
    ops = (
        (["+"] if x <= MAX_VALUE - 2 else []) + (["-"] if x >= 3 else []) + (["*"] if 1 <= x <= MAX_VALUE // 2 else [])
    )
    ops += ["/"] if x >= 4 and any(x % d == 0 for d in (2, 3, 4, 5)) else []
    op = rng.choice(ops)
    if op == "+":
        b = rng.randint(2, min(15, MAX_VALUE - x))  # >= 2: plural nouns read right
        s = rng.choice(
            [
                f"{pron} buys {b} more {item}.",
                f"{pron} finds {b} more {item}.",
                f"A friend gives {obj} {b} more {item}.",
            ]
        )
        return s, x + b, f"{x} + {b} = {x + b}"
    if op == "-":
        b = rng.randint(2, min(15, x - 1)) if x >= 3 else 1
        s = rng.choice([f"{pron} gives away {b} {item}.", f"{pron} loses {b} {item}.", f"{pron} uses {b} {item}."])
        return s, x - b, f"{x} - {b} = {x - b}"
    if op == "*":
        b = rng.randint(2, min(3, MAX_VALUE // x))
        return f"Then the number of {item} {'doubles' if b == 2 else 'triples'}.", x * b, f"{x} x {b} = {x * b}"
    d = rng.choice([d for d in (2, 3, 4, 5) if x % d == 0])
    return f"{pron} shares the {item} equally among {d} friends and keeps one share.", x // d, f"{x} / {d} = {x // d}"


def make_item(rng: random.Random, n_ops: int) -> dict:
    """One {"prompt", "solution", "answer"} item with ``n_ops`` (1..3) operations after the start."""
    name, pron = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    text, x, first = _start(rng, name, item)
    sentences, steps = [text], [first] if "x" in first else []
    for _ in range(n_ops - (1 if steps else 0)):
        s, x, step = _event(rng, x, pron, item)
        sentences.append(s)
        steps.append(step)
    question = f"How many {item} does {name} have now?"
    prompt = " ".join(sentences) + f" {question} {INSTRUCTION}"
    solution = ", ".join(steps) + f". The answer is \\boxed{{{x}}}."
    return {"prompt": prompt, "solution": solution, "answer": str(x), "n_ops": n_ops}


def generate(n: int, seed: int, min_ops: int = 1, max_ops: int = 3) -> list[dict]:
    """n items, deterministic for (n, seed, min_ops, max_ops) and prefix-stable in n.

    Raises ValueError if the operation range is empty or outside 1..3.
    """
    if not 1 <= min_ops <= max_ops <= 3:
        raise ValueError(f"math_word: need 1 <= min_ops <= max_ops <= 3, got {min_ops}..{max_ops}")
    rng = random.Random(seed)
    return [make_item(rng, rng.randint(min_ops, max_ops)) for _ in range(n)]
