"""TRL as the oracle of the GRPO maths: one batch through TRL 1.16's own ``GRPOTrainer`` and through ours.

A real TRL trainer (the micro model, a canned ``rollout_func`` and reward, ``steps_per_generation=1``)
computes the advantages inline in ``_generate_and_score_completions`` and the loss in
``_compute_loss``; ours runs the same batch through ``group_advantages`` and ``GRPOTrainer._train``
(micro-batched, as a step does). Advantages, loss, clip fraction and every gradient must agree, for each
configuration both trainers have: TRL ``loss_type`` grpo / bnpo / dr_grpo / dapo against our ``loss_agg``,
``scale_rewards`` group / batch / none, ``epsilon`` / ``epsilon_high`` against ``clip_low`` / ``clip_high``
(with old log-probs apart from the current ones, so the clip acts) and ``beta`` (k3 KL, a reference
that differs from the policy; with and without ``use_bias_correction_kl``, TRL's default KL times the ratio).

Where ours differs on purpose (docs/grpo-step.md, "The GRPO maths, checked against TRL"): the std's eps (ours 1e-6, as
verl; TRL 1e-4; here ours is called with TRL's), and an all-equal group's advantage (exactly 0 in ours; TRL's
is ~1e-3 when the mean is an ulp off), so the batches here have no all-equal group.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("trl", reason='the TRL cross-check needs trl==1.16.0: pip install -e ".[trl]"')

from workbench.grpo.advantages import group_advantages  # noqa: E402
from workbench.grpo.batch import sequence_logprobs  # noqa: E402
from workbench.grpo.trainer import GRPOTrainer  # noqa: E402
from workbench.run_build import build_parts
from workbench.specs import load_spec  # noqa: E402

G, P, PROMPT_LEN, MAX_NEW, TEMP = 4, 2, 5, 16, 0.7
REWARDS = [1.2, 0.2, 0.2, 1.0, 0.0, 0.7, 0.3, 1.2]  # two groups of 4, each with a spread, non-binary fractions
LOSS_AGG = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
    "dapo": "token_mean",
}


def _ours(loss_type: str, scale: str, eps_low: float, eps_high: float, beta: float, kl_corr: bool) -> GRPOTrainer:
    spec = load_spec(
        "micro",
        [
            "drafter.kind=none",
            "grpo.eval_every=0",
            "tracking.enabled=false",
            "measure.modeled=false",
            "task.num_eval=0",
            f"grpo.group_size={G}",
            f"grpo.prompts_per_step={P}",
            f"rollout.temperature={TEMP}",
            f"rollout.max_new_tokens={MAX_NEW}",
            "grpo.micro_batch_size=3",
            "grpo.max_grad_norm=1e9",
            "grpo.lr=1e-6",
            f"grpo.loss_agg={LOSS_AGG[loss_type]}",
            f"grpo.scale_rewards={scale}",
            f"grpo.clip_low={eps_low}",
            f"grpo.clip_high={eps_high}",
            f"grpo.beta={beta}",
            f"grpo.use_bias_correction_kl={kl_corr}",
        ],
    )
    return GRPOTrainer(build_parts(spec, progress=False))


def _canned_completions() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 500, (2 + (3 * i) % 14,), generator=g).tolist() for i in range(G * P)]  # 2..15 tokens


def _trl(
    ours: GRPOTrainer, loss_type: str, scale: str, eps_low: float, eps_high: float, beta: float, kl_corr: bool, tmp_path
):
    """TRL's GRPOTrainer on the same checkpoint, rolling out the canned completions."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    completions = _canned_completions()

    def rollout_func(prompts, trainer):  # one completion per entry; the extra key reaches the reward function
        return {
            "prompt_ids": [[1, 5, 6, 7, 8] for _ in prompts],
            "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions],
            "canned_reward": REWARDS,
        }

    def reward(prompts, completions, canned_reward, **kw):
        return canned_reward

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=G * P,
        num_generations=G,
        steps_per_generation=1,
        loss_type=loss_type,
        scale_rewards=scale,
        epsilon=eps_low,
        epsilon_high=eps_high,
        beta=beta,
        use_bias_correction_kl=kl_corr,
        max_completion_length=MAX_NEW,
        temperature=TEMP,
        report_to=[],
        use_cpu=True,
        bf16=False,
        max_steps=1,
        save_strategy="no",
    )
    model = AutoModelForCausalLM.from_pretrained(ours.target_path, dtype=torch.float32)
    tr = TRLTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        processing_class=ours.tokenizer,
        rollout_func=rollout_func,
    )
    tr.current_gradient_accumulation_steps = 1  # what its training loop sets before compute_loss
    return tr


CONFIGS = [  # (TRL loss_type, scale_rewards, epsilon, epsilon_high, beta, use_bias_correction_kl)
    ("grpo", "group", 0.2, 0.28, 0.0, False),
    ("bnpo", "group", 0.2, 0.28, 0.0, False),
    ("dr_grpo", "none", 0.2, 0.2, 0.0, False),
    ("dapo", "batch", 0.2, 0.28, 0.0, False),
    ("grpo", "batch", 0.1, 0.3, 0.04, False),
    ("bnpo", "none", 0.2, 0.2, 0.04, True),  # TRL's default KL (times the ratio)
    ("dapo", "group", 0.2, 0.28, 0.1, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,scale,eps_low,eps_high,beta,kl_corr", CONFIGS)
def test_advantages_loss_and_gradients_equal_trl(loss_type, scale, eps_low, eps_high, beta, kl_corr, tmp_path):
    torch.manual_seed(0)
    ours = _ours(loss_type, scale, eps_low, eps_high, beta, kl_corr)
    trl = _trl(ours, loss_type, scale, eps_low, eps_high, beta, kl_corr, tmp_path)
    with torch.no_grad():  # a policy apart from its reference, so the KL term has a gradient; the same in both
        for p in trl.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ours.policy.load_state_dict(trl.model.state_dict())

    trl.model.train()
    batch = trl._generate_and_score_completions([{"prompt": ["a", "b"][i // G]} for i in range(G * P)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (N, L), completions right-padded
    cmask = batch["completion_mask"].float()  # (N, Tc)
    n, L, Tc = ids.shape[0], ids.shape[1], cmask.shape[1]
    mask = torch.zeros(n, L - 1)
    mask[:, PROMPT_LEN - 1 :] = cmask  # (N, L-1): position j predicts token j+1
    # old log-probs apart from the current ones (ratios ~ e^{+-0.3}), so both sides of the clip act
    with torch.no_grad():
        cur = trl._get_per_token_logps_and_entropies(
            trl.model, ids, torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), Tc
        )[0]
    old_c = cur + 0.3 * torch.randn(cur.shape, generator=torch.Generator().manual_seed(3))
    batch["old_per_token_logps"] = old_c
    old = torch.zeros(n, L - 1)
    old[:, PROMPT_LEN - 1 :] = old_c

    # advantages: ours with TRL's eps (1e-4; ours defaults to verl's 1e-6)
    adv = group_advantages(torch.tensor(REWARDS), G, scale_rewards=scale, eps=1e-4)
    torch.testing.assert_close(adv, batch["advantages"], rtol=1e-5, atol=1e-6)

    trl.model.zero_grad()
    loss = trl._compute_loss(trl.model, batch)
    loss.backward()
    trl_grads = {k: p.grad.clone() for k, p in trl.model.named_parameters()}

    ref_logp = sequence_logprobs(ours.ref, ids, TEMP, 3) if beta > 0 else None
    stats = ours._train(ids, mask, torch.zeros_like(mask), ref_logp, batch["advantages"], old)
    assert stats["train/step_skipped"] == 0.0
    assert stats["loss/policy"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert stats["clip_frac"] == pytest.approx(trl._metrics["train"]["clip_ratio/region_mean"][-1], abs=1e-6)
    assert 0.0 < stats["clip_frac"] < 1.0  # the clip acted on some tokens, so epsilon's agreement means something
    for k, p in ours.policy.named_parameters():
        torch.testing.assert_close(p.grad, trl_grads[k], rtol=1e-5, atol=1e-7, msg=k)
    assert max(g.abs().max() for g in trl_grads.values()) > 1e-4  # a real gradient
