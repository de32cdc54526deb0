import torch

from workbench.rollout.sampling import SamplingParams, probs_from_logits


def test_temperature_one_is_softmax():
    logits = torch.randn(3, 10)
    assert torch.allclose(probs_from_logits(logits, SamplingParams(temperature=1.0)), logits.softmax(-1))


def test_temperature_scales_logits():
    logits = torch.randn(3, 10)
    got = probs_from_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(got, (logits / 0.5).softmax(-1))


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    p = probs_from_logits(logits, SamplingParams(temperature=0.0))
    assert p.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    p = probs_from_logits(logits, SamplingParams(top_k=2))
    assert (p[0, [0, 3]] == 0).all()
    assert torch.allclose(p[0, [1, 2]], torch.tensor([4.0, 3.0]).softmax(-1))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    p = probs_from_logits(probs.log(), SamplingParams(top_p=0.8))
    # 0.5 < 0.8, 0.5 + 0.3 = 0.8 reaches it: keep the first two tokens only.
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = probs_from_logits(probs.log(), SamplingParams(top_p=0.81))
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)


def test_top_k_then_top_p():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    p = probs_from_logits(probs.log(), SamplingParams(top_k=3, top_p=0.7))
    # top-k renormalises to (4, 3, 2)/9; top-p 0.7: 4/9 < 0.7 <= 7/9 keeps two tokens.
    assert torch.allclose(p, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))


def test_sample_follows_probs_and_never_picks_zero_mass():
    from scipy import stats

    from workbench.rollout.sampling import sample

    p = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.3])
    n = 100_000
    draws = sample(p.expand(n, -1).contiguous(), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5)
    assert counts[0] == 0 and counts[3] == 0
    expected = p[[1, 2, 4]].double() / p.double().sum() * n  # float32 p does not sum to 1 in float64 (scipy checks)
    assert stats.chisquare(counts[[1, 2, 4]].double().numpy(), expected.numpy()).pvalue > 1e-4


def test_sample_accepts_unnormalised_rows():
    from workbench.rollout.sampling import sample

    p = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    assert sample(p).tolist() == [1, 0]
