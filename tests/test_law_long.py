"""Sampled speculative rollouts follow the target's law over several verification steps.

The 3-token law tests (``test_engine.py`` and the drafters' own) see one verification step per
rollout: the prefill gives token 0, one step with k = 2 gives the rest. Here rollouts of 5 tokens
over a 4-token vocabulary (1024 joint cells, enumerated exactly) take 2-4 verification steps with
k = 2, so drafts are made from a history that earlier accepts and rejections (and, for suffix, the
siblings' tokens) shaped: each drafter kind, adaptive k, and rows joining a running batch.
"""

import pytest

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from drafters.suffix import SuffixDrafter
from drafters.training import fit
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams

from conftest import assert_rollouts_follow_target, perturbed_draft, random_llama
from test_chain_drafters import _make, _rollout_rows
from test_evaluation import CountingK

V = 4
PROMPT = [1, 3, 2, 3]
SP = SamplingParams(temperature=1.0, max_new_tokens=5)


def _target():
    return random_llama(vocab=V, hidden=32, seed=21, lm_head_std=0.6)


def _drafter(kind, target_hf, target):
    if kind == "draft_model":
        return DraftModelDrafter(perturbed_draft(target_hf, 0.4))
    if kind == "ngram":
        return NgramDrafter(1, 2)
    if kind == "suffix":
        return SuffixDrafter()
    rows, counts = _rollout_rows(target, n=64, max_new=8, layers=(0, 1, 2))
    d = _make(kind, target, counts, draft_vocab_size=3 if kind == "eagle3" else None)  # eagle3: q is 0 off its 3 ids
    fit(d, rows, steps=30, lr=3e-3, batch_size=16)
    return d


@pytest.mark.parametrize(
    "kind",
    [
        "draft_model",
        "ngram",
        pytest.param("suffix", marks=[pytest.mark.slow, pytest.mark.timeout(900)]),  # ~6 min on a loaded 2-core CPU
        "mtp",
        "eagle3",
    ],
)
def test_five_token_rollouts_follow_target(kind):
    target_hf = _target()
    target = LeanLM.from_hf(target_hf)
    out = assert_rollouts_follow_target(target, _drafter(kind, target_hf, target), PROMPT, SP)
    assert sum(out.counters.rows_per_forward) >= 2 * 30_000  # several verification steps per rollout (row-steps)


@pytest.mark.parametrize("kind", ["draft_model", "eagle3"])
def test_five_token_rollouts_with_adaptive_k_and_rows_joining(kind):
    target_hf = _target()
    target = LeanLM.from_hf(target_hf)
    out = assert_rollouts_follow_target(
        target, _drafter(kind, target_hf, target), PROMPT, SP, max_batch_size=4096, k_policy=CountingK(2)
    )
    assert set(out.counters.k_per_step) == {0, 1, 2}
