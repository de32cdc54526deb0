"""The coupled draft (Daliri, Musco and Suresh 2024): under keyed sampling a model drafter draws its draft
with the target's keyed noise, so a drafter whose q equals p is always accepted, and in general a draft is
accepted at least (1 - TV) / (1 + TV) of the time, where an argmax draft is accepted with p(argmax q)."""

import torch

from workbench.rollout.keyed import BLOCK, coupled_draft, keyed_sample

N = 20_000  # rows (seeds): the acceptance rates below are known to about +-0.007 (2 sigma)


def _p_q():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(8, generator=g), -1)
    q = torch.softmax(torch.log(p) + 0.6 * torch.randn(8, generator=g), -1)  # near p, not equal
    return p, q


def _accept(p, q, mode):
    seeds = torch.arange(N, dtype=torch.long) * 7919 + 11
    pos = torch.full((N,), 5, dtype=torch.long)
    target = keyed_sample(p.expand(N, 1, -1), seeds, pos[:, None])[:, 0]  # (N,) the token plain decoding emits
    draft = coupled_draft(q.expand(N, -1), seeds, pos) if mode == "coupled" else q.argmax().expand(N)
    return (draft == target).double().mean().item()


def test_a_drafter_equal_to_the_target_is_always_accepted():
    p, _ = _p_q()
    assert _accept(p, p, "coupled") == 1.0
    assert abs(_accept(p, p, "argmax") - p.max().item()) < 0.01  # argmax: only p(argmax) of the time


def test_coupled_acceptance_clears_the_coupling_bound_and_beats_argmax_on_a_spread_p():
    p, q = _p_q()
    tv = 0.5 * (p - q).abs().sum().item()
    coupled, argmax = _accept(p, q, "coupled"), _accept(p, q, "argmax")
    assert coupled >= (1 - tv) / (1 + tv) - 0.01, (coupled, tv)
    assert coupled <= 1 - tv + 0.01  # no coupling beats the optimal one
    assert abs(argmax - p[q.argmax()].item()) < 0.01
    assert coupled > argmax + 0.05, (coupled, argmax)


def test_a_reduced_vocabulary_keys_its_columns_by_token_id():
    """Columns of a draft vocabulary (eagle3's d2t) get the noise of the target ids they stand for: the same
    draft as over the full vocabulary with q zero outside it."""
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([3, 7, 8, 12, 20])
    q_d = torch.softmax(torch.randn(64, 5, generator=g), -1)
    full = torch.zeros(64, 32)
    full[:, ids] = q_d
    seeds, pos = torch.arange(64) * 31 + 1, torch.arange(64) % 9
    assert torch.equal(ids[coupled_draft(q_d, seeds, pos, ids)], coupled_draft(full, seeds, pos))


def test_across_blocks_a_drafter_equal_to_the_target_is_always_accepted_and_ids_key_by_token():
    """Over three blocks both levels share the target's noise: q = p gives p's token for every seed, and a
    reduced vocabulary whose ids span the blocks drafts as its full-vocabulary embedding."""
    V = 2 * BLOCK + 88
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(V, generator=g), -1)
    seeds, pos = torch.arange(2000) * 13 + 5, torch.arange(2000) % 11
    target = keyed_sample(p.expand(2000, 1, -1), seeds, pos[:, None])[:, 0]
    assert (target // BLOCK).unique().numel() == 3
    assert torch.equal(coupled_draft(p.expand(2000, -1), seeds, pos), target)
    ids = torch.tensor([3, 7, BLOCK + 1, BLOCK + 2, 2 * BLOCK + 9, V - 1])
    q_d = torch.softmax(torch.randn(2000, 6, generator=g), -1)
    full = torch.zeros(2000, V)
    full[:, ids] = q_d
    assert torch.equal(ids[coupled_draft(q_d, seeds, pos, ids)], coupled_draft(full, seeds, pos))
