"""The two-token joint law as chi-square cells (workbench.audit.joint): dense where small, first
tokens too rare to fill a cell pooled per first token at a real vocabulary, and still exact."""

import pytest
import torch

from workbench.audit import Joint2, exact_joint2, goodness_of_fit
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams, probs_from_logits

from conftest import random_llama

V = 64
EOS = 2
PROMPT = [1, 5, 7, 9]
SP = SamplingParams(temperature=1.0, max_new_tokens=2, eos_token_id=EOS)


@pytest.fixture(scope="module")
def target():
    return LeanLM.from_hf(random_llama(vocab=V, hidden=32, layers=1, seed=3, lm_head_std=0.6))


@torch.no_grad()
def dense_law(target, prompt, sp) -> torch.Tensor:
    """(V, V) p(x0, x1 | x0 != EOS) by brute force: the full sequence prompt + x0 through the model, per x0."""
    seqs = torch.tensor([prompt + [v] for v in range(V)])  # (V, P+1)
    cache = target.new_cache(V, len(prompt) + 2)
    logits, _ = target(seqs, torch.zeros(V, dtype=torch.long), cache)  # (V, P+1, V)
    p0 = probs_from_logits(logits[0, len(prompt) - 1], sp).double()
    p0[EOS] = 0.0
    p1 = probs_from_logits(logits[:, len(prompt)], sp).double()  # (V, V)
    joint = p0[:, None] * p1
    return joint / joint.sum()


def test_dense_when_small_matches_brute_force(target):
    j = exact_joint2(target, PROMPT, SP, EOS)
    assert j.first.numel() == V - 1  # every first token but EOS kept cell by cell
    dense = torch.zeros(V, V, dtype=torch.float64)
    dense[j.first] = j.rows
    assert torch.allclose(dense, dense_law(target, PROMPT, SP), atol=1e-9)
    assert float(j.probs().sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(j.rest.abs().sum()) == 0.0


def test_rare_first_tokens_pooled_per_first_token(target):
    n = 400
    j = exact_joint2(target, PROMPT, SP, EOS, n=n, max_cells=V)  # force the large-vocabulary path
    law = dense_law(target, PROMPT, SP)
    p0 = law.sum(1)
    keep = (p0 * n >= 5.0).nonzero().flatten()
    keep = keep[p0[keep].topk(min(keep.numel(), 1)).indices]  # max_cells // V = 1 row kept, the most probable
    assert j.first.tolist() == sorted(keep.tolist())
    assert torch.allclose(j.rows, law[j.first], atol=1e-9)
    rest = p0.clone()
    rest[j.first] = 0.0
    assert torch.allclose(j.rest, rest, atol=1e-9)  # each pooled first token: its whole row's mass
    assert float(j.probs().sum()) == pytest.approx(1.0, abs=1e-6)


def test_pooling_threshold_uses_n(target):
    law = dense_law(target, PROMPT, SP)
    p0 = law.sum(1)
    sizes = []
    for n in (50, 500, 5000):
        j = exact_joint2(target, PROMPT, SP, EOS, n=n, max_cells=(V - 2) * V)  # sparse: 63 x V cells > max_cells
        wanted = set((p0 * n >= 5.0).nonzero().flatten().tolist())
        assert set(j.first.tolist()) <= wanted and j.first.numel() == min(len(wanted), V - 2)
        sizes.append(j.first.numel())
    assert sizes[0] < sizes[1] <= sizes[2]  # more rows: more first tokens fill a cell


def test_observed_cells():
    first = torch.tensor([3, 5])
    j = Joint2(first, torch.zeros(2, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64))
    o = j.observed(torch.tensor([3, 3, 5, 7, 7, 0]), torch.tensor([1, 1, 6, 2, 4, 0]))
    assert o.numel() == 2 * 8 + 8 and float(o.sum()) == 6
    assert o[0 * 8 + 1] == 2 and o[1 * 8 + 6] == 1  # kept rows: (x0, x1) cells
    assert o[16 + 7] == 2 and o[16 + 0] == 1  # pooled rows: one cell per first token
    with pytest.raises(ValueError, match="token ids"):
        j.observed(torch.tensor([8]), torch.tensor([0]))
    with pytest.raises(ValueError, match="differ"):
        j.observed(torch.tensor([1, 2]), torch.tensor([0]))


@pytest.mark.parametrize("biased", [False, True])
def test_exact_samples_pass_and_a_biased_second_token_fails(target, biased):
    # pairs drawn from the exact law pass the pooled test; drawing x1 at temperature 1.5 for the kept
    # (frequent) first tokens, which is where a wrong verifier shows, fails it
    n = 20000
    j = exact_joint2(target, PROMPT, SP, EOS, n=n, max_cells=8 * V)
    g = torch.Generator().manual_seed(11)
    law = dense_law(target, PROMPT, SP)
    x0 = torch.multinomial(law.sum(1).float(), n, replacement=True, generator=g)
    cond = law / law.sum(1, keepdim=True).clamp_min(1e-300)
    if biased:
        cond = cond.clamp_min(1e-300) ** (1 / 1.5)
        cond = cond / cond.sum(1, keepdim=True)
    x1 = torch.multinomial(cond[x0].float(), 1, generator=g)[:, 0]
    stat, df, p = goodness_of_fit(j.observed(x0, x1), j.probs() * n)
    assert df > 10
    assert (p < 1e-6) if biased else (p > 1e-3)


def test_rows_per_forward_bounds_the_logits():
    from workbench.audit.law import rows_per_forward

    assert rows_per_forward(64, 4, 4096) == 4096  # a small vocabulary: the limit
    r = rows_per_forward(49152, 4, 4096)
    assert r * 4 * 49152 <= 1 << 27 < (r + 1) * 4 * 49152  # SmolLM2: as many rows as fit the budget
    assert rows_per_forward(10**9, 10, 4096) == 1  # never 0
