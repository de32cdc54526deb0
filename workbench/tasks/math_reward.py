"""Math rewards from math-verify, as TRL's and open-r1's accuracy rewards compute them.

    math_accuracy_reward("... so \\\\boxed{12}.", "12")   # 1.0: the boxed answer equals the gold one
    boxed_format_reward("The answer is \\\\boxed{12}.")   # 1.0: the completion boxes an answer

Accuracy (open-r1 ``accuracy_reward``, TRL ``trl.rewards.accuracy_reward``): the gold answer is
parsed with math-verify's default extraction; ``verify`` compares it with the completion's answer
symbolically (12 = 12.0 = 24/2). The completion's answer is, in this order, (1) its last
``\\boxed{...}``, or (2) the first line after its last documented anchor, "the answer is" /
"the final answer is" or "Answer:" (whole words, any case). Nothing else counts: math-verify's own
anchors match any word containing "answer" ("I answered 3", "answers: 3, 12"), so the workbench
finds the anchor itself and hands math-verify only the text after it; a number that merely appears
in the reasoning never scores. The plain anchored answer is what a small chat model writes before it
learns to box (measured: SmolLM2-135M-Instruct boxes almost never); the format reward is what asks
for the box.
Format: the completion boxes a non-empty answer (``\\boxed{...}``), the instruction every math
prompt gives. Both return floats in {0.0, 1.0}: a malformed rollout cannot crash a step. A gold
answer math-verify cannot parse gives 0.0 (open-r1 skips such rows; a GRPO batch needs a number for
every row). math-verify's timeouts use ``signal.alarm``, which works in the main thread only: off it
every answer would silently score 0, so the accuracy reward refuses there (RuntimeError).
Source: github.com/huggingface/Math-Verify, open-r1 src/open_r1/rewards.py.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

_PLACEHOLDER_RE = re.compile(r"[A-Za-z]+")  # a box's content that is a bare word: a placeholder, not a value
# the documented plain-answer anchors, whole words: "the answer is", "the final answer is", "Answer:"
_ANCHOR_RE = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b|\banswer\s*:", re.IGNORECASE)
# an operation between two operands: digit or closing bracket, operator, digit, opening bracket or command
_OPERATION_RE = re.compile(r"[\d)}\]]\s*(?:[-+*/×÷^]|\\times|\\cdot|\\div)\s*[\d({\[\\]")


@lru_cache(maxsize=1)
def _math_verify():
    """(parse, verify, completion extraction config), imported on first use (~0.5 s, sympy).

    Raises ValueError naming the extra if math-verify is not installed.
    """
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        raise ValueError(
            'the math rewards need math-verify: pip install -e ".[real]" (or pip install math-verify)'
        ) from None
    norm = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True)
    # the text handed over is already just the answer (a boxed tail or the line after an anchor)
    cfg = [
        LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=True),
        ExprExtractionConfig(try_extract_without_anchor=True),
    ]
    return parse, verify, cfg


def _boxed_content(text: str, start: int) -> str | None:
    """The contents of the ``\\boxed{...}`` at ``start`` (balanced braces), or None if it never closes."""
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def answer_text(completion: str) -> tuple[str, bool] | None:
    """The final answer ``completion`` states and whether it was boxed, or None: the contents of its
    last ``\\boxed{...}``, else the first non-empty line after its last documented anchor (markdown
    bold removed); in either, only what follows the last "=" (the result of a worked line such as
    "4 + 7 = 11"). An empty box is no answer (nothing after it is read)."""
    box = completion.rfind("\\boxed")
    if box >= 0:
        text = _boxed_content(completion, box)
    else:
        anchors = list(_ANCHOR_RE.finditer(completion))
        if not anchors:
            return None
        tail = completion[anchors[-1].end() :].replace("**", "").lstrip(" \t:\n")
        text = tail.split("\n", 1)[0]
    text = (text or "").rsplit("=", 1)[-1].strip()
    return (text, box >= 0) if text else None


def is_unevaluated(answer: str) -> bool:
    """True when ``answer`` is arithmetic still to be done ("4 + 7", "3 \\times 5", "15 - 43"): math-verify
    would evaluate it and score it right, so copying a chain-sum prompt into the box would earn the
    reward without computing. A leading minus and ``\\frac{a}{b}`` are numbers, not operations."""
    return bool(_OPERATION_RE.search(answer))


@lru_cache(maxsize=4096)
def _gold(answer: str):
    parse, _, _ = _math_verify()
    return parse(answer if "$" in answer or "\\" in answer else f"${answer}$", extraction_mode="first_match")


def math_accuracy_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer (:func:`answer_text`) equals ``answer`` mathematically, else 0.0.

    Raises:
        ValueError: math-verify is not installed.
        RuntimeError: called off the main thread (math-verify's timeout is ``signal.alarm``; every
            answer would score 0.0 there): score in the main thread, or in worker processes.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "the math accuracy reward must run in the main thread: math-verify times out with "
            "signal.alarm, which fails in any other thread and would score every answer 0; "
            "score in the main thread or in processes (e.g. multiprocessing), not threads"
        )
    parse, verify, cfg = _math_verify()
    try:
        gold = _gold(str(answer).strip())
        found = answer_text(completion)
        if not gold or found is None or is_unevaluated(found[0]):
            return 0.0
        text, boxed = found
        got = parse(f"\\boxed{{{text}}}" if boxed else text, extraction_config=cfg, extraction_mode="first_match")
        return 1.0 if got and verify(gold, got) else 0.0
    except Exception:  # math-verify's own timeouts and sympy errors on odd text: a wrong answer, not a crash
        return 0.0


_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number_reward(completion: str, answer: str) -> float:
    """1.0 if the last number written anywhere in ``completion`` equals ``answer`` (a number), else 0.0.

    An anchor-free check beside :func:`math_accuracy_reward`: it reads no "\\boxed" or "the answer is",
    so a rise in it is arithmetic learned, not a format made readable (and a model that ends on its result
    without boxing it still counts). Logged, never trained on. Thousands commas are ignored; never raises.
    """
    found = _NUMBER_RE.findall(completion)
    try:
        return (
            1.0 if found and float(found[-1].replace(",", "")) == float(str(answer).strip().replace(",", "")) else 0.0
        )
    except ValueError:
        return 0.0


def boxed_format_reward(completion: str, answer: str | None = None) -> float:
    """1.0 if the completion's last ``\\boxed{...}`` holds a value, else 0.0 (``answer`` unused).

    A value: non-empty and not a bare word. A box holding only letters (``\\boxed{N}``,
    ``\\boxed{answer}``) is the placeholder of an instruction copied, not an answer: with the
    smollm2-learn system prompt ("write the final answer as \\boxed{N}") one GRPO run learned to
    write ``\\boxed{N}`` for the format reward alone (42 of 52 logged samples of its second half).
    """
    matches = list(re.finditer(r"\\boxed\s*\{", completion))
    if not matches:
        return 0.0
    content = _boxed_content(completion, matches[-1].start())
    if content is None or not content.strip():
        return 0.0
    return 0.0 if _PLACEHOLDER_RE.fullmatch(content.strip()) else 1.0
