"""The cost maths live in one module (workbench.rollout.cost): its small functions by hand, and no other
module defining them again."""

import ast
from pathlib import Path

import pytest

from workbench import perf
from workbench.rollout import cost, kpolicy

ROOT = Path(__file__).resolve().parents[1]
ONE_PLACE = (
    "expected_emitted",
    "tokens_per_step",
    "expected_tokens",
    "alpha_from_per_position",
    "fit_alpha",
    "alpha_from_acceptance_length",
    "modeled_step_s",
    "knee_verify_ratio",
    "gen_speedup",
    "best_k",
    "best_of",
)


def test_no_other_module_defines_the_cost_maths():
    """A module-level function of these names anywhere else in the project is a second copy of a formula."""
    again = []
    for p in sorted(ROOT.glob("workbench/**/*.py")) + sorted(ROOT.glob("drafters/**/*.py")):
        if p == ROOT / "workbench/rollout/cost.py":
            continue
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in ONE_PLACE:
                again.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not again, f"cost maths defined outside workbench/rollout/cost.py: {again}"


def test_the_readers_share_the_functions():
    assert perf.expected_tokens is cost.expected_tokens and perf.gen_speedup is cost.gen_speedup
    assert perf.tokens_per_step is cost.tokens_per_step and kpolicy.best_k is cost.best_k


def test_emitted_tokens_three_ways_agree():
    a, k = 0.6, 4
    surv = [a ** (i + 1) for i in range(k)]  # i.i.d. acceptance: s_i = α^(i+1)
    assert cost.expected_emitted(surv, k) == pytest.approx(cost.expected_tokens(a, k))
    assert cost.tokens_per_step(surv) == pytest.approx(cost.expected_tokens(a, k))
    assert cost.expected_emitted(surv, 2, draft_share=0.5) == pytest.approx(1 + 0.5 * (0.6 + 0.36))
    assert cost.expected_emitted(surv, 0) == 1.0


def test_step_cost_skips_the_drafter_at_k0():
    calls = []
    drafter = lambda n, k: calls.append((n, k)) or 0.5  # noqa: E731
    assert cost.modeled_step_s(4, 0, lambda t: t / 100, drafter) == pytest.approx(0.04) and not calls
    assert cost.modeled_step_s(4, 3, lambda t: t / 100, drafter) == pytest.approx(0.16 + 0.5) and calls == [(4, 3)]


def test_best_of_breaks_ties_to_the_smaller_k():
    assert cost.best_of({3: 1.2, 1: 1.2, 5: 1.1}) == 1
    assert cost.best_of({1: 1.0, 2: 1.3}) == 2
    with pytest.raises(ValueError, match="empty"):
        cost.best_of({})
