"""GRPO maths against numbers worked out by hand (docs/design.md §4)."""

import math

import pytest
import torch

from workbench.grpo.advantages import frac_zero_std, group_advantages
from workbench.grpo.loss import LOSS_AGGS, aggregate, grpo_loss, kl_k3, token_logprobs
from workbench.grpo.mismatch import LOG_TINY, logprob_gaps, processed_token_logprobs
from workbench.rollout.sampling import SamplingParams, probs_from_logits

# ----------------------------------------------------------------------------- advantages

# Two groups of G = 3.
#   group 0: r = [1, 2, 3] -> mean 2, deviations [-1, 0, 1], unbiased var (1+0+1)/2 = 1, std 1
#   group 1: r = [0, 0, 6] -> mean 2, deviations [-2, -2, 4], unbiased var (4+4+16)/2 = 12, std 2*sqrt(3)
REWARDS = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])


def test_group_advantages_hand_values():
    s3 = 2 * math.sqrt(3)
    expected = torch.tensor([-1.0, 0.0, 1.0, -2 / s3, -2 / s3, 4 / s3])
    got = group_advantages(REWARDS, group_size=3, eps=0.0)
    torch.testing.assert_close(got, expected)
    # Default eps (1e-6) only shifts values in the 6th digit.
    torch.testing.assert_close(group_advantages(REWARDS, 3), expected, atol=1e-5, rtol=1e-5)


def test_group_advantages_dr_grpo_no_scaling():
    got = group_advantages(REWARDS, group_size=3, scale_rewards=False)
    torch.testing.assert_close(got, torch.tensor([-1.0, 0.0, 1.0, -2.0, -2.0, 4.0]))


def test_group_advantages_all_equal_group_is_zero():
    got = group_advantages(torch.tensor([5.0, 5.0, 5.0, 1.0, 0.0, 1.0]), group_size=3)
    assert torch.all(got[:3] == 0)
    assert torch.isfinite(got).all()
    # G = 1: each sample is its own group; advantage 0, not NaN.
    assert torch.all(group_advantages(torch.tensor([1.0, 7.0]), group_size=1) == 0)


def test_group_advantages_int_rewards_and_bad_n():
    torch.testing.assert_close(
        group_advantages(torch.tensor([0, 1, 1, 0]), 2, scale_rewards=False), torch.tensor([-0.5, 0.5, 0.5, -0.5])
    )
    with pytest.raises(ValueError, match="grpo.group_size"):
        group_advantages(torch.ones(7), group_size=3)
    with pytest.raises(ValueError, match="grpo.group_size"):
        frac_zero_std(torch.ones(7), group_size=3)


def test_frac_zero_std():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    assert frac_zero_std(r, 3) == pytest.approx(2 / 4)
    assert frac_zero_std(REWARDS, 3) == 0.0
    assert frac_zero_std(torch.zeros(4), 2) == 1.0
    assert frac_zero_std(torch.zeros(0), 4) == 0.0


# ----------------------------------------------------------------------------- aggregation

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregate_hand_values():
    # seq 0 keeps 1, 2; seq 1 keeps 4.
    # GRPO: per-seq means 1.5 and 4.0 -> (1.5 + 4) / 2 = 2.75
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_mean").item() == pytest.approx(2.75)
    # DAPO: (1 + 2 + 4) / 3 tokens
    assert aggregate(PER_TOKEN, MASK, "token_mean").item() == pytest.approx(7 / 3)
    # Dr. GRPO with max_len 4: per-seq sums 3 and 4 -> (3/4 + 4/4) / 2 = 0.875 (= 7 / (2 * 4))
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm", max_len=4).item() == pytest.approx(0.875)


def test_aggregate_empty_sequences_no_nan():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # Empty sequence counts as 0 in the mean over sequences: (1.5 + 0) / 2
    assert aggregate(PER_TOKEN, mask, "seq_mean_token_mean").item() == pytest.approx(0.75)
    assert aggregate(PER_TOKEN, mask, "token_mean").item() == pytest.approx(1.5)
    assert aggregate(PER_TOKEN, mask, "seq_mean_token_sum_norm", max_len=3).item() == pytest.approx(0.5)
    zero = torch.zeros_like(mask)
    for agg in LOSS_AGGS:
        assert aggregate(PER_TOKEN, zero, agg, max_len=3).item() == 0.0


def test_aggregate_errors():
    with pytest.raises(ValueError, match="seq_mean_token_mean, token_mean, seq_mean_token_sum_norm"):
        aggregate(PER_TOKEN, MASK, "sum")
    with pytest.raises(ValueError, match="max_len"):
        aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError):
        aggregate(PER_TOKEN, MASK[:, :2], "token_mean")


# ----------------------------------------------------------------------------- KL


def test_kl_k3_known_values():
    lp = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    ref = torch.log(torch.tensor([0.5, 0.25, 1.0]))
    # ref/p = 1 -> 0;  ref/p = 0.5 -> 0.5 - ln 0.5 - 1 = ln 2 - 0.5;  ref/p = 2 -> 2 - ln 2 - 1 = 1 - ln 2
    expected = torch.tensor([0.0, math.log(2) - 0.5, 1 - math.log(2)])
    torch.testing.assert_close(kl_k3(lp, ref), expected)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, generator=g) * 3, torch.randn(4, 7, generator=g) * 3
    assert (kl_k3(a, b) >= 0).all()
    assert torch.all(kl_k3(a, a) == 0)


# ----------------------------------------------------------------------------- grpo_loss


def test_grpo_loss_on_policy_hand_values():
    old = torch.log(torch.tensor([[0.2, 0.3, 0.4], [0.5, 0.6, 0.7]]))
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 2.0])
    # ratio == 1 everywhere, so the objective is A per valid token: seq0 tokens (1, 1), seq1 token (2).
    loss, stats = grpo_loss(logp, old, adv, MASK, 0.2, 0.28, "token_mean")
    assert loss.item() == pytest.approx(-(1 + 1 + 2) / 3)
    loss, _ = grpo_loss(logp, old, adv, MASK, 0.2, 0.28, "seq_mean_token_mean")
    assert loss.item() == pytest.approx(-(1 + 2) / 2)
    loss, _ = grpo_loss(logp, old, adv, MASK, 0.2, 0.28, "seq_mean_token_sum_norm", max_len=4)
    assert loss.item() == pytest.approx(-(2 / 4 + 2 / 4) / 2)
    assert stats == {
        "clip_frac": 0.0,
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.0,
        "kl": 0.0,
        "ratio_mean": pytest.approx(1.0),
    }


def test_grpo_loss_clipping_gradients():
    # One token per sequence, clip range [0.8, 1.2].
    ratios = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    #   1.5, A>0: past 1+eps_high in the rewarded direction -> clipped, no gradient
    #   1.5, A<0: unclipped term is the min -> gradient
    #   0.5, A<0: below 1-eps_low, pushing further down is clipped -> no gradient
    #   0.5, A>0: unclipped -> gradient
    #   1.1, A>0: inside the range -> gradient
    old = torch.full((5, 1), -1.0)
    logp = (old + torch.log(ratios).unsqueeze(1)).requires_grad_(True)
    mask = torch.ones(5, 1)
    loss, stats = grpo_loss(logp, old, adv, mask, 0.2, 0.2, "token_mean")
    loss.backward()
    grad = logp.grad.squeeze(1)
    # d/dlogp of -(ratio * A) / 5 = -ratio * A / 5 where the unclipped term is active.
    expected = torch.tensor([0.0, 1.5 / 5, 0.0, -0.5 / 5, -1.1 / 5])
    torch.testing.assert_close(grad, expected)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["clip_frac_low"] == pytest.approx(1 / 5)
    assert stats["clip_frac_high"] == pytest.approx(1 / 5)
    assert stats["ratio_mean"] == pytest.approx(ratios.mean().item())
    # Loss value: -(1.2*1 + 1.5*-1 + 0.8*-1 ... min terms) / 5
    #   row0 min(1.5, 1.2) = 1.2; row1 min(-1.5, -1.2) = -1.5; row2 min(-0.5, -0.8) = -0.8;
    #   row3 min(0.5, 0.8) = 0.5; row4 1.1
    assert loss.item() == pytest.approx(-(1.2 - 1.5 - 0.8 + 0.5 + 1.1) / 5)


def test_grpo_loss_kl_penalty():
    lp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.25, 1.0]]))
    adv = torch.zeros(1)
    loss, stats = grpo_loss(lp, lp.detach(), adv, torch.ones(1, 2), 0.2, 0.2, "token_mean", beta=0.1, ref_logp=ref)
    mean_kl = ((math.log(2) - 0.5) + (1 - math.log(2))) / 2  # = 0.25
    assert stats["kl"] == pytest.approx(mean_kl)
    assert loss.item() == pytest.approx(0.1 * mean_kl)
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    # With a reference but beta 0, the KL is reported but not in the loss.
    loss0, stats0 = grpo_loss(lp, lp.detach(), adv, torch.ones(1, 2), 0.2, 0.2, "token_mean", ref_logp=ref)
    assert loss0.item() == 0.0 and stats0["kl"] == pytest.approx(mean_kl)


@pytest.mark.parametrize("agg", LOSS_AGGS)
def test_grpo_loss_with_its_own_detached_logp_is_the_policy_gradient(agg):
    # One optimiser step per batch: old_logp = logp.detach() (pi_old = pi_theta), so the ratio is 1 and
    # the gradient is that of the plain surrogate -aggregate(A * logp) (TRL's single-iteration GRPO).
    g = torch.Generator().manual_seed(2)
    logp = (torch.randn(2, 3, generator=g) - 1).requires_grad_(True)
    adv = torch.tensor([0.7, -1.3])
    loss, stats = grpo_loss(logp, logp.detach(), adv, MASK, 0.2, 0.28, agg, max_len=4)
    (grad,) = torch.autograd.grad(loss, logp)
    plain = -aggregate(adv[:, None] * logp, MASK, agg, max_len=4)
    (expected,) = torch.autograd.grad(plain, logp)
    assert loss.item() == pytest.approx(-aggregate(adv[:, None].expand(2, 3), MASK, agg, max_len=4).item())
    torch.testing.assert_close(grad, expected)
    assert grad.abs().sum() > 0 and stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    # grpo_loss detaches old_logp itself: passing logp undetached must not cancel the gradient.
    (grad_undetached,) = torch.autograd.grad(grpo_loss(logp, logp, adv, MASK, 0.2, 0.28, agg, max_len=4)[0], logp)
    torch.testing.assert_close(grad_undetached, expected)


def test_grpo_loss_errors():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(lp, lp, torch.zeros(2), MASK, 0.2, 0.2, "token_mean", beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(lp, lp, torch.zeros(3), MASK, 0.2, 0.2, "token_mean")
    with pytest.raises(ValueError, match="allowed values"):
        grpo_loss(lp, lp, torch.zeros(2), MASK, 0.2, 0.2, "nope")


# ----------------------------------------------------------------------------- token_logprobs


def test_token_logprobs_matches_manual():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    tokens = torch.tensor([[0, 4, 2], [1, 1, 3]])
    for temp in (1.0, 0.7):
        probs = torch.softmax(logits / temp, dim=-1)
        manual = torch.stack([torch.stack([probs[b, t, tokens[b, t]].log() for t in range(3)]) for b in range(2)])
        torch.testing.assert_close(token_logprobs(logits, tokens, temp), manual)
    torch.testing.assert_close(token_logprobs(logits, tokens, 0.0), token_logprobs(logits, tokens, 1.0))
    out = token_logprobs(logits.bfloat16(), tokens)
    assert out.dtype == torch.float32 and out.shape == (2, 3)
    with pytest.raises(ValueError):
        token_logprobs(logits, tokens, -1.0)


def test_token_logprobs_differentiable_through_loss():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    tokens = torch.tensor([[0, 4, 2], [1, 1, 3]])
    lp = token_logprobs(logits, tokens)
    loss, _ = grpo_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]), MASK, 0.2, 0.28, "token_mean")
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- engine/trainer log-prob gaps

# One position, V = 4, probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
#   top-k 2 (or top-p 0.65: 0.4 + 0.3 reaches it) keeps {0, 1}, mass 0.7 -> processed p = (4/7, 3/7, 0, 0)
#   so for a kept token: processed log p - temperature-only log p = -log 0.7 (the kept mass).
GAP_LOGITS = torch.log(torch.tensor([[[0.4, 0.3, 0.2, 0.1]] * 3]))  # (1, 3, 4): the same law at 3 positions
GAP_TOKENS = torch.tensor([[0, 1, 3]])
GAP_MASK = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding


def _gaps(sp, engine=None, mask=GAP_MASK):
    temp_lp = token_logprobs(GAP_LOGITS, GAP_TOKENS, sp.temperature)
    engine = temp_lp if engine is None else engine
    return logprob_gaps(GAP_LOGITS, GAP_TOKENS, temp_lp, engine, mask, sp)


@pytest.mark.parametrize("sp", [SamplingParams(top_k=2), SamplingParams(top_p=0.65)])
def test_logprob_gaps_truncation_hand_values(sp):
    # engine off by a little at token 0; junk off the mask
    engine = torch.log(torch.tensor([[4 / 7 + 0.01, 3 / 7, 123.0]]))
    mismatch, trunc = _gaps(sp, engine)
    torch.testing.assert_close(trunc, torch.tensor([[-math.log(0.7), -math.log(0.7), 0.0]]))
    torch.testing.assert_close(
        mismatch, torch.tensor([[math.log(4 / 7 + 0.01) - math.log(4 / 7), 0.0, 0.0]]), atol=1e-6, rtol=0
    )


def test_logprob_gaps_without_truncation_are_the_old_metric():
    sp = SamplingParams(temperature=0.7)
    temp_lp = token_logprobs(GAP_LOGITS, GAP_TOKENS, 0.7)
    engine = temp_lp + torch.tensor([[0.003, -0.002, 5.0]])
    mismatch, trunc = logprob_gaps(GAP_LOGITS, GAP_TOKENS, temp_lp, engine, GAP_MASK, sp)
    assert torch.equal(trunc, torch.zeros(1, 3))  # exactly: processing is the temperature only
    assert torch.equal(mismatch, (engine - temp_lp).abs() * GAP_MASK)  # |engine - trainer temperature-only|


def test_logprob_gaps_greedy_and_outside_support():
    # Greedy: the processed law is one-hot on token 0, so its log p is 0 and the truncation gap is -log 0.4.
    mismatch, trunc = _gaps(SamplingParams(temperature=0.0), engine=torch.zeros(1, 3), mask=torch.tensor([[1.0, 0, 0]]))
    assert mismatch[0, 0].item() == 0.0
    assert trunc[0, 0].item() == pytest.approx(-math.log(0.4))
    # A token the trainer's top-k excludes (the logits disagree at the boundary): finite LOG_TINY, not -inf.
    mismatch, trunc = _gaps(SamplingParams(top_k=2), engine=torch.full((1, 3), math.log(0.5)), mask=torch.ones(1, 3))
    assert mismatch[0, 2].item() == pytest.approx(math.log(0.5) - LOG_TINY)
    assert torch.isfinite(mismatch).all() and torch.isfinite(trunc).all()


def test_processed_token_logprobs_is_the_engines_formula():
    g = torch.Generator().manual_seed(3)
    logits, tokens = torch.randn(50, 11, generator=g) * 3, torch.randint(0, 11, (50,), generator=g)
    sp = SamplingParams(temperature=0.9, top_k=6, top_p=0.9)
    engine = probs_from_logits(logits, sp).gather(-1, tokens[:, None]).squeeze(-1).log()  # as RolloutEngine records it
    got = processed_token_logprobs(logits, tokens, sp, token_logprobs(logits[None], tokens[None], 0.9)[0])
    kept = torch.isfinite(engine)
    assert kept.any() and (~kept).any()
    assert torch.equal(got[kept], engine[kept])
    assert torch.all(got[~kept] == LOG_TINY)
    with pytest.raises(ValueError, match="logits must be"):
        logprob_gaps(logits, tokens, tokens.float(), tokens.float(), tokens.float(), sp)


# ----------------------------------------------------------------------------- advantages: exactly GRPO's


@pytest.mark.parametrize("value", [1.2, 0.2, 0.7, 0.3])
@pytest.mark.parametrize("G", [4, 8, 16])
@pytest.mark.parametrize("mode", ["group", "batch", "none"])
def test_an_all_equal_group_gets_exactly_zero_advantage(value, G, mode):
    """Rewards that are not binary fractions: the float32 mean of G equal values is one ulp off, and that
    ulp over std + eps (std ~ 0) used to give every member the same non-zero advantage (1.2 x 8: +0.106)."""
    r = torch.cat([torch.full((G,), value), torch.arange(G, dtype=torch.float32) / G])  # one flat group, one not
    a = group_advantages(r, G, scale_rewards=mode)
    assert torch.equal(a[:G], torch.zeros(G))
    assert a[G:].abs().min() > 0  # the group with a spread keeps its signal
    assert frac_zero_std(r, G) == 0.5


def test_batch_scaling_divides_by_the_whole_batch_std():
    """TRL's scale_rewards='batch': centred by the group mean, divided by the std of every reward."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    got = group_advantages(r, 4, scale_rewards="batch", eps=0.0)
    centred = r.view(2, 4) - r.view(2, 4).mean(1, keepdim=True)
    torch.testing.assert_close(got, (centred / r.std()).reshape(-1))
    # with ranks the trainer passes the std of every rank's rewards
    torch.testing.assert_close(group_advantages(r, 4, "batch", eps=0.0, batch_std=2.0), (centred / 2.0).reshape(-1))


def test_scale_rewards_accepts_trl_bools_and_names_the_allowed_values():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert torch.equal(group_advantages(r, 4, scale_rewards=True), group_advantages(r, 4, scale_rewards="group"))
    assert torch.equal(group_advantages(r, 4, scale_rewards=False), group_advantages(r, 4, scale_rewards="none"))
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(r, 4, scale_rewards="rank")
    from workbench.specs import load_spec

    assert load_spec("micro", ["grpo.scale_rewards=false"]).grpo.scale_rewards == "none"
    assert load_spec("micro", ["grpo.scale_rewards=batch"]).grpo.scale_rewards == "batch"
    with pytest.raises(ValueError, match="scale_rewards"):
        load_spec("micro", ["grpo.scale_rewards=rank"])


def test_learning_signal_is_any_non_zero_advantage_or_a_kl_term():
    from workbench.grpo.advantages import has_learning_signal

    assert not has_learning_signal(torch.zeros(8))
    assert has_learning_signal(torch.zeros(8), beta=0.04)
    assert has_learning_signal(torch.tensor([0.0, 1e-30]))
