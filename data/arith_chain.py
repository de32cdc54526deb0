"""arith_chain: evaluate a chain of integer operations strictly left to right, showing each step.

Example item:
    prompt:   "Evaluate left to right: 7 + 5 - 3 * 2\\n"
    solution: "7+5=12, 12-3=9, 9*2=18. Answer: 18"
    answer:   "18"

Operands are chosen so every intermediate result stays in 0..99: `+` never exceeds 99, `-` never
goes below 0, `*` multiplies by 2..9 only when the product is <= 99. The written steps make the
gold completion long (~45 tokens on average with single-digit tokens), which is what speculative
decoding needs to have something to accelerate. 3-6 ops by default: with 4-7 the tiny preset
needs ~30 % more pretraining steps to reach its accuracy target (measured), and the CPU build
budget is ~5 minutes.
"""

from __future__ import annotations

import random

PROMPT_PREFIX = "Evaluate left to right: "
ANSWER_PREFIX = "Answer: "
VERSION = 1  # bump when the generator changes: invalidates cached data, tokenizer and models
MAX_VALUE = 99
MAX_ADD_SUB_OPERAND = 30  # keeps operands short so steps are learnable; results still span 0..99


def apply_op(x: int, op: str, b: int) -> int:
    """x op b for op in '+', '-', '*'. Raises ValueError on an unknown op."""
    if op == "+":
        return x + b
    if op == "-":
        return x - b
    if op == "*":
        return x * b
    raise ValueError(f"unknown op {op!r}; allowed: + - *")


def _next_step(rng: random.Random, x: int) -> tuple[str, int]:
    """One (op, operand) legal from value x (0..99), so that the result stays in 0..MAX_VALUE."""
    ops = []
    if x < MAX_VALUE:
        ops.append("+")
    if x >= 1:
        ops.append("-")
    if 1 <= x <= MAX_VALUE // 2:  # some d in 2..9 keeps x*d <= 99
        ops.append("*")
    op = rng.choice(ops)
    if op == "+":
        return op, rng.randint(1, min(MAX_ADD_SUB_OPERAND, MAX_VALUE - x))
    if op == "-":
        return op, rng.randint(1, min(MAX_ADD_SUB_OPERAND, x))
    return op, rng.randint(2, min(9, MAX_VALUE // x))


def make_item(rng: random.Random, n_ops: int) -> dict:
    """One {"prompt", "answer", "solution"} item with n_ops operations, drawn from rng."""
    x = rng.randint(1, 20)
    expr = [str(x)]
    steps = []
    for _ in range(n_ops):
        op, b = _next_step(rng, x)
        y = apply_op(x, op, b)
        expr += [op, str(b)]
        steps.append(f"{x}{op}{b}={y}")
        x = y
    prompt = PROMPT_PREFIX + " ".join(expr) + "\n"
    solution = ", ".join(steps) + f". {ANSWER_PREFIX}{x}"
    return {"prompt": prompt, "answer": str(x), "solution": solution}


def generate(n: int, seed: int, min_ops: int = 3, max_ops: int = 6) -> list[dict]:
    """n items, deterministic for (seed, min_ops, max_ops).

    Returns a list of dicts with string fields prompt (ends with "\\n"), answer (an integer
    0..99 as text) and solution (the gold completion that follows the prompt).
    Raises ValueError if n < 0 or the ops range is empty.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got min_ops={min_ops}, max_ops={max_ops}")
    rng = random.Random(seed)
    return [make_item(rng, rng.randint(min_ops, max_ops)) for _ in range(n)]


def parse_prompt(prompt: str) -> tuple[int, list[tuple[str, int]]]:
    """Inverse of the prompt format: (start, [(op, operand), ...]). Used by tests and checks."""
    body = prompt.removeprefix(PROMPT_PREFIX).strip().split(" ")
    start = int(body[0])
    return start, [(body[i], int(body[i + 1])) for i in range(1, len(body), 2)]
