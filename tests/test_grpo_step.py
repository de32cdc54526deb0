"""The GRPO step, exact and lean: one optimiser step per batch needs no separate old-log-p forward
(pi_old = pi_theta), and the engine/trainer log-prob diagnostics come from the training forward."""

import math

import pytest
import torch

from workbench.grpo.batch import sequence_logprobs
from workbench.grpo.trainer import GRPOTrainer
from workbench.rollout.sampling import SamplingParams
from workbench.run_build import build_parts
from workbench.specs import load_spec

MICRO_BATCH = 3  # 8 rollouts per step -> micro-batches of 3, 3, 2 (uneven on purpose)


def _trainer(*overrides: str) -> GRPOTrainer:
    spec = load_spec(
        "micro",
        [
            "drafter.kind=none",
            "grpo.eval_every=0",
            "tracking.enabled=false",
            f"grpo.micro_batch_size={MICRO_BATCH}",
            *overrides,
        ],
    )
    return GRPOTrainer(build_parts(spec, progress=False))


def _batch(tr: GRPOTrainer, n: int = 7, L: int = 14, seed: int = 0):
    """A synthetic padded batch: ids (n, L), completion mask (n, L-1) of varied lengths, advantages (n,)."""
    g = torch.Generator().manual_seed(seed)
    V = tr.policy.config.vocab_size
    ids = torch.randint(3, V, (n, L), generator=g)
    mask = torch.zeros(n, L - 1)
    for i in range(n):
        p, c = 3 + i % 3, 4 + (2 * i) % 6  # prompt, completion lengths
        mask[i, p - 1 : p - 1 + c] = 1.0
        ids[i, p + c :] = tr.tokenizer.pad_token_id
    adv = torch.randn(n, generator=g)
    return ids, mask, adv


def _update(tr: GRPOTrainer, state, ids, mask, adv, separate_forward: bool, ref_logp=None):
    """Restore ``state`` (policy, optimiser), run one ``_train``; return its stats, the grads and the new weights."""
    tr.policy.load_state_dict(state[0])
    tr.optimizer.load_state_dict(state[1])
    old = None
    if separate_forward:  # what the logprob stage used to do: a no-grad forward of the same policy
        with torch.no_grad():
            old = sequence_logprobs(tr.policy, ids, tr.sampling.temperature or 1.0, MICRO_BATCH)
    stats = tr._train(ids, mask, torch.zeros_like(mask), ref_logp, adv, old)
    grads = [p.grad.clone() for p in tr.policy.parameters()]
    return stats, grads, [p.detach().clone() for p in tr.policy.parameters()]


@pytest.mark.parametrize("overrides", [[], ["grpo.loss_agg=seq_mean_token_mean", "grpo.beta=0.04", "grpo.lr=1e-3"]])
def test_one_step_update_is_the_same_without_the_separate_old_logp_forward(overrides):
    tr = _trainer(*overrides)
    ids, mask, adv = _batch(tr)
    ref_logp = None
    if tr.ref is not None:  # a reference that differs from the policy, so the KL term has a gradient
        with torch.no_grad():
            for p in tr.ref.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
            ref_logp = sequence_logprobs(tr.ref, ids, 1.0, MICRO_BATCH)
    w0 = [p.detach().clone() for p in tr.policy.parameters()]
    state = ({k: v.clone() for k, v in tr.policy.state_dict().items()}, tr.optimizer.state_dict())
    s_sep, g_sep, w_sep = _update(tr, state, ids, mask, adv, True, ref_logp)
    s_one, g_one, w_one = _update(tr, state, ids, mask, adv, False, ref_logp)

    assert s_one["loss/policy"] == pytest.approx(s_sep["loss/policy"], rel=1e-6, abs=1e-9)
    assert s_one["grad_norm"] == pytest.approx(s_sep["grad_norm"], rel=1e-6)
    assert s_one["kl"] == pytest.approx(s_sep["kl"], rel=1e-6, abs=1e-12)
    assert s_one["clip_frac"] == s_sep["clip_frac"] == 0.0
    assert s_sep["grad_norm"] > 1e-3  # a real update, so equal gradients mean something
    for a, b in zip(g_one, g_sep):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    for a, b, w in zip(w_one, w_sep, w0):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    assert any(not torch.equal(a, w) for a, w in zip(w_one, w0))


def _forwards_per_stage(tr: GRPOTrainer, module: torch.nn.Module) -> dict[str, int]:
    """Run one step and count ``module``'s forward calls in each stage."""
    current, counts = {"stage": None}, {}

    def hook(mod, args):
        counts[current["stage"]] = counts.get(current["stage"], 0) + 1

    h = module.register_forward_pre_hook(hook)
    try:
        tr.step(1, on_stage=lambda name: current.update(stage=name))
    finally:
        h.remove()
    return counts


def test_logprob_stage_runs_no_policy_forward():
    tr = _trainer()
    n_micro = math.ceil(8 / MICRO_BATCH)  # micro: 2 prompts x 4 samples
    counts = _forwards_per_stage(tr, tr.policy)
    assert counts.get("logprob", 0) == 0
    assert counts["train"] == n_micro  # the training forward is the only one


def test_logprob_stage_keeps_the_forwards_still_needed():
    # The reference model (beta > 0) and online drafter adaptation (hidden states + logits) still run there.
    tr = _trainer("drafter.kind=draft_model", "drafter.init.data=none", "drafter.online.enabled=true", "grpo.beta=0.04")
    n_micro = math.ceil(8 / MICRO_BATCH)
    assert _forwards_per_stage(tr, tr.policy)["logprob"] == n_micro
    assert _forwards_per_stage(tr, tr.ref)["logprob"] == n_micro


def _step_with_old_metric(tr: GRPOTrainer, monkeypatch) -> tuple[dict, float]:
    """One step, plus the pre-split ``gen/logprob_abs_diff`` (engine vs a separate temperature-only
    forward of the policy before the update) computed beside it."""
    seen = {}
    real = tr._train

    def spy(ids, mask, rollout_logp, ref_logp, adv, old_logp=None):
        with torch.no_grad():
            lp = sequence_logprobs(tr.policy, ids, tr.sampling.temperature or 1.0, MICRO_BATCH)
        seen["old"] = float(((rollout_logp - lp).abs() * mask).sum() / mask.sum().clamp_min(1))
        return real(ids, mask, rollout_logp, ref_logp, adv, old_logp)

    monkeypatch.setattr(tr, "_train", spy)
    return tr.step(1)[0], seen["old"]


def test_logprob_metrics_without_truncation(monkeypatch):
    tr = _trainer("rollout.temperature=0.7")
    m, old = _step_with_old_metric(tr, monkeypatch)
    assert m["gen/logprob_truncation_abs_diff"] == 0.0
    assert m["gen/logprob_abs_diff"] == pytest.approx(old, rel=1e-5, abs=1e-9)
    assert m["gen/logprob_abs_diff"] < 1e-5  # same weights in engine and trainer: float noise only


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.8)])
def test_logprob_metrics_split_truncation_from_mismatch(monkeypatch, top_k, top_p):
    tr = _trainer(f"rollout.top_k={top_k}", f"rollout.top_p={top_p}")
    m, old = _step_with_old_metric(tr, monkeypatch)
    assert m["gen/logprob_abs_diff"] < 1e-5  # identical weights: the engine's law is reproduced
    assert m["gen/logprob_truncation_abs_diff"] > 1e-3  # truncation moves mass onto the kept tokens
    assert old == pytest.approx(m["gen/logprob_truncation_abs_diff"], abs=1e-5)  # the old number was truncation


def test_logprob_metrics_greedy_rollouts():
    tr = _trainer()
    tr.sampling = SamplingParams(0.0, 1.0, 0, tr.sampling.max_new_tokens, tr.sampling.eos_token_id)
    m = tr.step(1)[0]
    assert m["gen/logprob_abs_diff"] == 0.0  # the engine's log p of an argmax token is log 1 = 0, so is ours
    assert m["gen/logprob_truncation_abs_diff"] > 0  # one-hot argmax vs the temperature-1 training law
