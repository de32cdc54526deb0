"""Asynchronous GRPO (grpo.async): truncated importance weights, the rollout worker's protocol,
staleness as configured, and, with a policy that does not move, the very rollouts of a
synchronous run."""

import multiprocessing

import pytest
import torch

from workbench.grpo.loss import grpo_loss, truncated_is_weight
from workbench.specs import load_spec


def test_truncated_is_weight_is_the_capped_ratio():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    beh = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    w = truncated_is_weight(old, beh, cap=3.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 3.0]]))  # 0.9 / 0.1 = 9 capped at 3


def test_is_weight_scales_each_tokens_gradient():
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28, "token_mean")
    (g1,) = torch.autograd.grad(loss, logp)
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28, "token_mean", is_weight=torch.tensor([[2.0, 0.5]]))
    (g2,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(g2, g1 * torch.tensor([[2.0, 0.5]]))
    with pytest.raises(ValueError, match="is_weight shape"):
        grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28, "token_mean", is_weight=torch.ones(2, 2))


@pytest.mark.parametrize(
    "override,needle",
    [
        ("measure.paired=true", "measure.paired=false"),
        ("drafter.online.enabled=true", "drafter.online.enabled=false"),
    ],
)
def test_unsupported_combinations_are_refused_naming_the_fields(override, needle):
    from workbench.grpo.async_rollout import check_async
    from workbench.specs.resolve import rollout_config

    s = load_spec("micro", ["grpo.async.enabled=true", override])
    with pytest.raises(ValueError, match="grpo.async.enabled") as e:
        check_async(rollout_config(s), s.paired)
    assert needle in str(e.value)


FAST = ["grpo.eval_every=0", "grpo.steps=4", "measure.modeled=false", "tracking.enabled=false"]


def _run(overrides):
    from workbench.experiment import run_experiment

    return run_experiment(load_spec("micro", FAST + overrides), progress=False).history


def test_a_still_policy_gives_the_synchronous_rollouts_and_staleness_is_as_configured():
    """lr ~ 0: the weights never change, so the worker (its own engine, the same seed, the prompts
    drawn in step order) must produce the synchronous run's rollouts exactly, s steps ahead."""
    still = ["grpo.lr=1e-30"]
    sync = _run(still)
    asyn = _run(still + ["grpo.async.enabled=true", "grpo.async.staleness=2"])
    for key in ("reward/mean", "completions/mean_length", "gen/num_tokens", "spec/acceptance_length"):
        assert [h[key] for h in asyn] == [h[key] for h in sync], key
    assert [h["async/staleness"] for h in asyn] == [0.0, 1.0, 2.0, 2.0]  # the first s steps use the initial weights
    assert all("timing_s/gen_exposed" in h and "timing_s/gen" in h for h in asyn)
    assert all(h["async/is_weight_mean"] == pytest.approx(1.0, abs=1e-4) for h in asyn)
    assert not multiprocessing.active_children()  # the worker stopped with the run


def test_a_dead_worker_is_a_clear_error():
    from workbench.grpo.async_rollout import RolloutWorker
    from workbench.models import resolve_model
    from workbench.specs.resolve import rollout_config, trainer_config

    spec = load_spec("micro")
    w = RolloutWorker(rollout_config(spec), trainer_config(spec), resolve_model("micro"), None, torch.device("cpu"))
    try:
        w.process.kill()
        w.process.join(timeout=10)
        with pytest.raises(RuntimeError, match="rollout worker died"):
            w.receive(timeout=5)
    finally:
        w.close()
