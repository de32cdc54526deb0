"""Exactness of modified rejection sampling (Leviathan et al. 2023), checked statistically.

Each test draws N independent verification steps in one batch and runs a chi-square
goodness-of-fit test of the emitted token against p. False-alarm rate per test: ALPHA = 1e-4.
With N = 200k samples over V = 8 tokens, moving 1 percentage point of probability onto or off a
token of probability p adds about N * 0.01^2 / p to the statistic (>= 80 for p <= 0.25), far past
the ALPHA critical value (29.9 at 7 dof): a real 1 % bias is caught with near certainty.
"""

import pytest
import torch
from scipy import stats

from workbench.rollout.rejection import rejection_sample
from workbench.rollout.sampling import SamplingParams, probs_from_logits

ALPHA = 1e-4
N = 200_000
V = 8


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token with zero target probability"
    exp = expected[keep].numpy()
    return stats.chisquare(counts[keep].numpy(), exp * samples.numel() / exp.sum()).pvalue


def run(p, q, k, num_draft=None, seed=0):
    """p: (k+1, V), q: (k, V) or None (deterministic drafts drawn from `det`)."""
    g = torch.Generator().manual_seed(seed)
    P = p[None].expand(N, -1, -1)
    if q is not None:
        drafts = torch.multinomial(q, N, replacement=True, generator=g).T  # (N, k)
        Q = q[None].expand(N, -1, -1)
    else:
        drafts = torch.randint(0, V, (N, k), generator=g)
        Q = None
    nd = torch.full((N,), k) if num_draft is None else num_draft
    return rejection_sample(P.contiguous(), drafts, None if Q is None else Q.contiguous(), nd, g), drafts


def rand_dist(*shape, seed=0, sharp=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * sharp).softmax(-1)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_first_token_follows_p_probabilistic_drafts(k, seed):
    p, q = rand_dist(k + 1, V, seed=seed), rand_dist(k, V, seed=seed + 100)
    (n_acc, tokens), _ = run(p, q, k, seed=seed)
    assert chi2_pvalue(tokens[:, 0], p[0]) > ALPHA


@pytest.mark.parametrize("k", [1, 4])
def test_first_token_follows_p_one_hot_drafts(k):
    p = rand_dist(k + 1, V, seed=3)
    (n_acc, tokens), _ = run(p, None, k, seed=3)
    assert chi2_pvalue(tokens[:, 0], p[0]) > ALPHA


def test_second_token_given_acceptance_follows_p1():
    # With context-free p_i, position 1 is emitted only after accepting position 0; its law is p_1.
    k = 2
    p, q = rand_dist(k + 1, V, seed=5), rand_dist(k, V, seed=6)
    (n_acc, tokens), _ = run(p, q, k, seed=5)
    emitted_two = n_acc >= 1
    assert chi2_pvalue(tokens[emitted_two, 1], p[1]) > ALPHA


def test_with_top_k_and_top_p_processed_distributions():
    sp = SamplingParams(temperature=0.8, top_k=5, top_p=0.9)
    g = torch.Generator().manual_seed(7)
    p = probs_from_logits(torch.randn(3, V, generator=g) * 2, sp)
    q = probs_from_logits(torch.randn(2, V, generator=g) * 2, sp)
    (n_acc, tokens), _ = run(p, q, 2, seed=7)
    assert chi2_pvalue(tokens[:, 0], p[0]) > ALPHA


def test_rows_with_fewer_drafts_sample_plain_p():
    k = 3
    p, q = rand_dist(k + 1, V, seed=8), rand_dist(k, V, seed=9)
    (n_acc, tokens), _ = run(p, q, k, num_draft=torch.zeros(N, dtype=torch.long), seed=8)
    assert (n_acc == 0).all()
    assert chi2_pvalue(tokens[:, 0], p[0]) > ALPHA


def test_rows_with_some_but_fewer_than_k_drafts():
    """0 < num_draft < k: after the last real draft is accepted the next position is a plain
    sample from p there (like a bonus token), never a residual against a non-draft's q."""
    k = 3
    p, q = rand_dist(k + 1, V, seed=20), rand_dist(k, V, seed=21)
    (n_acc, tokens), _ = run(p, q, k, num_draft=torch.ones(N, dtype=torch.long), seed=20)
    assert n_acc.max() == 1 and 0 < n_acc.float().mean() < 1
    assert chi2_pvalue(tokens[:, 0], p[0]) > ALPHA
    assert chi2_pvalue(tokens[n_acc == 1, 1], p[1]) > ALPHA


def test_acceptance_rate_matches_alpha():
    # P(accept x ~ q) = sum_x min(p, q) (Leviathan et al., Definition 3.1).
    p, q = rand_dist(2, V, seed=10), rand_dist(1, V, seed=11)
    (n_acc, _), _ = run(p, q, 1, seed=10)
    alpha = torch.minimum(p[0], q[0]).sum().item()
    assert abs(n_acc.double().mean().item() - alpha) < 5 * (alpha * (1 - alpha) / N) ** 0.5


def test_identical_p_and_q_accept_everything():
    p = rand_dist(3, V, seed=12)
    (n_acc, tokens), drafts = run(p, p[:2].clone(), 2, seed=12)
    assert (n_acc == 2).all()
    assert torch.equal(tokens[:, :2], drafts)


def test_greedy_accepts_iff_draft_is_argmax():
    p = torch.zeros(4, 4, 5)
    p[..., 2] = 1.0  # argmax 2 everywhere
    drafts = torch.tensor([[2, 2, 2], [2, 1, 2], [0, 2, 2], [2, 2, 4]])
    n_acc, tokens = rejection_sample(p, drafts, None, torch.full((4,), 3))
    assert n_acc.tolist() == [3, 1, 0, 2]
    for b, n in enumerate(n_acc.tolist()):
        assert tokens[b, n] == 2  # correction/bonus is the argmax


def test_chi_square_detects_a_biased_sampler():
    # Power check: accepting every draft (ignoring p/q) must fail the same test.
    p, q = rand_dist(2, V, seed=13), rand_dist(1, V, seed=14)
    g = torch.Generator().manual_seed(13)
    drafts = torch.multinomial(q, N, replacement=True, generator=g).T  # (N, 1) always "accepted"
    assert chi2_pvalue(drafts[:, 0], p[0]) < ALPHA
