"""GRPO learns: the trainer's updates move log-probabilities the way the advantages say, and a reward
the micro model can easily move rises within 30 steps; with the advantage's sign flipped it falls
(issue #30 part 5a). The rollouts, rewards, loss, micro-batching and optimiser are the real ones."""

import pytest
import torch

import workbench.grpo.trainer as trainer_mod
from data import arith_chain
from workbench.grpo.batch import pack_rollouts, sequence_logprobs
from workbench.grpo.trainer import GRPOTrainer
from workbench.run_build import build_parts
from workbench.specs import load_spec
from workbench.tasks import TASKS, Task

TARGET = "="  # micro's first completion token is "=" about 7 % of the time (its 3rd most likely)


def _trainer(*overrides: str) -> GRPOTrainer:
    spec = load_spec(
        "micro",
        [
            "drafter.kind=none",
            "grpo.eval_every=0",
            "tracking.enabled=false",
            "measure.modeled=false",
            "task.num_eval=0",
            *overrides,
        ],
    )
    return GRPOTrainer(build_parts(spec, progress=False))


def _flip_advantages(monkeypatch) -> None:
    """The negative control: the trainer's advantages with their sign flipped."""
    group_advantages = trainer_mod.group_advantages
    monkeypatch.setattr(trainer_mod, "group_advantages", lambda r, G, **kw: -group_advantages(r, G, **kw))


def _sampled_batch(tr: GRPOTrainer, prompt_rows: list[int], copies: int):
    """The policy's own completions of the given train prompts (``copies`` each), packed as the trainer packs them."""
    prompts = [tr.prompt_format.encode(tr.train_data[i]["prompt"]) for i in prompt_rows for _ in range(copies)]
    out = tr.backend.generate(prompts, tr.sampling, torch.Generator().manual_seed(0))
    return pack_rollouts(prompts, out, tr.tokenizer.pad_token_id, tr.device)


def _seq_logp(tr: GRPOTrainer, ids, mask) -> torch.Tensor:
    """(N,) summed log-prob of each row's completion tokens under the current policy."""
    with torch.no_grad():
        return (sequence_logprobs(tr.policy, ids, 1.0, 8) * mask).sum(1)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_updates_raise_a_positive_and_lower_a_negative_advantage_logprob(sign):
    """Two completions of two prompts, advantages +1 / -1 (x sign): each of 3 optimiser steps raises
    the positive one's log-prob and lowers the negative one's (the sign follows the advantage)."""
    tr = _trainer("grpo.lr=1e-5", "rollout.max_new_tokens=12")
    ids, mask, rollout_logp = _sampled_batch(tr, [0, 1], 1)
    adv = sign * torch.tensor([1.0, -1.0])
    prev = _seq_logp(tr, ids, mask)
    for _ in range(3):
        stats = tr._train(ids, mask, rollout_logp, None, adv)
        assert stats["train/step_skipped"] == 0.0
        now = _seq_logp(tr, ids, mask)
        assert (torch.sign(now - prev) == torch.sign(adv)).all(), (now - prev, adv)
        prev = now


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_updates_raise_the_advantage_weighted_logprob_of_a_group_batch(sign):
    """8 rows (4 prompts x 2 samples, micro-batches of 3, 3, 2), advantages +-1: sum_i A_i log p_i rises
    at every step (the policy gradient's first-order guarantee; single rows may move either way when
    their prompts' siblings pull against them) and the positive rows gain more than the negative ones."""
    tr = _trainer("grpo.lr=1e-5", "grpo.micro_batch_size=3", "rollout.max_new_tokens=12")
    ids, mask, rollout_logp = _sampled_batch(tr, [0, 1, 2, 3], 2)
    adv = sign * torch.tensor([1.0, -1.0] * 4)
    before = prev = _seq_logp(tr, ids, mask)
    for _ in range(3):
        tr._train(ids, mask, rollout_logp, None, adv)
        now = _seq_logp(tr, ids, mask)
        assert float((adv * (now - prev)).sum()) > 0.0
        prev = now
    delta = prev - before
    assert delta[adv > 0].mean() > 0.01 and delta[adv < 0].mean() < -0.01, delta


def test_a_batch_without_signal_takes_no_step():
    """All advantages 0 (every group's rewards equal, beta 0): the gradient is exactly 0 and the
    weights must not move, even with AdamW momentum left from an earlier step (which would move them)."""
    tr = _trainer("grpo.lr=1e-3", "rollout.max_new_tokens=8")
    ids, mask, rollout_logp = _sampled_batch(tr, [0, 1], 4)
    tr._train(ids, mask, rollout_logp, None, torch.tensor([1.0, -1.0] * 4))  # momentum now non-zero
    w = [p.detach().clone() for p in tr.policy.parameters()]
    stats = tr._train(ids, mask, rollout_logp, None, torch.zeros(8))
    assert stats["grad_norm"] == 0.0 and stats["train/step_skipped"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(w, tr.policy.parameters()))


@pytest.mark.parametrize("value", [1.2, 0.2, 0.7])
def test_groups_of_equal_non_binary_rewards_take_no_step(value):
    """Correct-and-boxed (1.2), wrong-but-boxed (0.2) ...: all-equal groups whose float32 mean is one ulp
    off used to get a shared non-zero advantage, so the batch stepped; now nothing moves."""
    tr = _trainer("grpo.lr=1e-3", "rollout.max_new_tokens=8")
    ids, mask, rollout_logp = _sampled_batch(tr, [0, 1], 4)
    tr._train(ids, mask, rollout_logp, None, torch.tensor([1.0, -1.0] * 4))  # momentum now non-zero
    w = [p.detach().clone() for p in tr.policy.parameters()]
    # G = 8 (at G = 4 these means happen to round exactly; at 8 and 16 they do not)
    adv = trainer_mod.group_advantages(torch.full((8,), value), 8, scale_rewards=tr.config.grpo.scale_rewards)
    stats = tr._train(ids, mask, rollout_logp, None, adv)
    assert stats["train/step_skipped"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(w, tr.policy.parameters()))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_gradient_moves_no_weight_and_is_counted(dtype, bad):
    """An inf/NaN gradient (float32: clipping multiplies it by 0, giving NaN weights; bfloat16: the master
    AdamW declined it but the step was not counted) never reaches the weights; the next batch trains."""
    tr = _trainer("grpo.lr=1e-3", "rollout.max_new_tokens=8", f"model.dtype={dtype}")
    ids, mask, rollout_logp = _sampled_batch(tr, [0, 1], 2)
    adv = torch.tensor([1.0, -1.0] * 2)
    w = [p.detach().clone() for p in tr.policy.parameters()]
    p0 = next(tr.policy.parameters())
    hook = p0.register_hook(lambda g: torch.full_like(g, bad))
    stats = tr._train(ids, mask, rollout_logp, None, adv)
    hook.remove()
    assert stats["train/step_skipped"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(w, tr.policy.parameters()))
    assert all(torch.isfinite(p).all() for p in tr.policy.parameters())
    stats = tr._train(ids, mask, rollout_logp, None, adv)  # a finite batch after it steps as usual
    assert stats["train/step_skipped"] == 0.0
    assert any(not torch.equal(a, p) for a, p in zip(w, tr.policy.parameters()))


def _first_token_task(monkeypatch) -> None:
    """A test-local task: arith_chain prompts, reward 1 when the completion starts with TARGET."""
    monkeypatch.setitem(
        TASKS,
        "first_token",
        Task(
            "first_token",
            arith_chain.generate,
            lambda completion, answer: float(completion.startswith(TARGET)),
            "reward = the completion starts with '='",
            version=arith_chain.VERSION,
        ),
    )


def _expected_reward(tr: GRPOTrainer, prompts: list[list[int]]) -> float:
    """Exact expected reward: P(first completion token decodes to a string starting with TARGET), mean over prompts."""
    good = torch.tensor([tr.tokenizer.decode([i]).startswith(TARGET) for i in range(tr.policy.config.vocab_size)])
    with torch.no_grad():
        return sum(
            torch.softmax(tr.policy(torch.tensor([p])).logits[0, -1], -1)[good].sum().item() for p in prompts
        ) / len(prompts)


@pytest.mark.parametrize("flipped", [False, True])
def test_an_easy_reward_rises_within_30_steps_and_falls_with_the_sign_flipped(monkeypatch, flipped):
    """30 GRPO steps of 8 prompts x 8 samples (4 tokens each), the whole trainer step (rollouts, reward,
    advantages, loss, AdamW): P(reward) rises from ~0.07 to > 0.3; flipped, it falls below 0.02."""
    _first_token_task(monkeypatch)
    if flipped:
        _flip_advantages(monkeypatch)
    tr = _trainer(
        "task.name=first_token",
        "task.num_train=64",
        "rollout.max_new_tokens=4",
        "grpo.prompts_per_step=8",
        "grpo.group_size=8",
        "grpo.lr=1e-3",
        "grpo.steps=30",
    )
    probe = [tr.prompt_format.encode(p) for p in tr.train_data["prompt"][:32]]
    before = _expected_reward(tr, probe)
    rewards = [tr.step(s)[0]["reward/mean"] for s in range(1, 31)]
    after = _expected_reward(tr, probe)
    assert 0.03 < before < 0.15
    if not flipped:
        assert after > before + 0.25, (before, after, rewards)
        assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.15, rewards
    else:
        assert after < 0.02, (before, after, rewards)
        assert sum(rewards[-5:]) / 5 < sum(rewards[:5]) / 5, rewards
