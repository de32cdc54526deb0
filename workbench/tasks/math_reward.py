"""Math rewards from math-verify, as TRL's and open-r1's accuracy rewards compute them.

    math_accuracy_reward("... so \\\\boxed{12}.", "12")   # 1.0: the boxed answer equals the gold one
    boxed_format_reward("The answer is \\\\boxed{12}.")   # 1.0: the completion boxes an answer

Accuracy (open-r1 ``accuracy_reward``, TRL ``trl.rewards.accuracy_reward``): the gold answer is
parsed with math-verify's default extraction; the completion with LaTeX extraction, boxed answers
first (``boxed_match_priority=0``), then math-verify's plain-expression extraction (its default's
second config), both only after an anchor ("\\boxed", "the answer is", "Answer:"), so a number that
merely appears in the reasoning never counts; ``verify`` compares them symbolically (12 = 12.0 =
24/2). The plain anchored answer is what a small chat model writes before it learns to box (measured:
SmolLM2-135M-Instruct boxes almost never); the format reward is what asks for the box.
Format: the completion boxes a non-empty answer (``\\boxed{...}``), the instruction every math
prompt gives. Both return floats in {0.0, 1.0} and never raise: a malformed rollout cannot crash a
step. A gold answer math-verify cannot parse gives 0.0 (open-r1 skips such rows; a GRPO batch
needs a number for every row).
Source: github.com/huggingface/Math-Verify, open-r1 src/open_r1/rewards.py.
"""

from __future__ import annotations

import re
from functools import lru_cache

_BOXED_RE = re.compile(r"\\boxed\s*\{\s*[^{}\s]")


@lru_cache(maxsize=1)
def _math_verify():
    """(parse, verify, completion extraction config), imported on first use (~0.5 s, sympy).

    Raises ValueError naming the extra if math-verify is not installed.
    """
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        raise ValueError("the math rewards need math-verify: pip install -e \".[real]\" (or pip install math-verify)") from None
    norm = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True)
    cfg = [LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=False),
           ExprExtractionConfig(try_extract_without_anchor=False)]
    return parse, verify, cfg


@lru_cache(maxsize=4096)
def _gold(answer: str):
    parse, _, _ = _math_verify()
    return parse(answer if "$" in answer or "\\" in answer else f"${answer}$", extraction_mode="first_match")


def math_accuracy_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's (boxed) final answer equals ``answer`` mathematically, else 0.0.

    Raises ValueError only if math-verify is not installed.
    """
    parse, verify, cfg = _math_verify()
    try:
        gold = _gold(str(answer).strip())
        if not gold:
            return 0.0
        got = parse(completion, extraction_config=cfg, extraction_mode="first_match")
        return 1.0 if got and verify(gold, got) else 0.0
    except Exception:  # math-verify's own timeouts and sympy errors on odd text: a wrong answer, not a crash
        return 0.0


def boxed_format_reward(completion: str, answer: str | None = None) -> float:
    """1.0 if the completion contains ``\\boxed{...}`` with something inside, else 0.0 (``answer`` unused)."""
    return 1.0 if _BOXED_RE.search(completion) else 0.0
