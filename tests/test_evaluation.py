"""The held-out evaluation: it leaves later training rollouts unchanged (its own generator, no updates to the
adaptive-k policy) and logs the drafter's acceptance on the prompts it scores.
"""

import pytest


class CountingK:
    """A stateful KPolicy: k_t cycles with the number of updates seen (any eval update shifts it)."""

    def __init__(self, k: int):
        self.k, self.updates = k, 0

    def choose(self, num_rows: int) -> int:
        return self.updates % (self.k + 1)

    def update(self, k_t, num_rows, num_drafts, accepted_per_pos) -> None:
        self.updates += 1


def test_evaluate_leaves_later_rollouts_unchanged():
    """eval_every must not change training: evaluate() used the training generator (greedy
    sampling still draws) and fed its steps to the adaptive-k policy. The next rollouts after an
    evaluate() are the ones without it."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.run_build import build_parts
    from workbench.specs import load_spec

    spec = load_spec(
        "micro", ["drafter.kind=draft_model", "tracking.enabled=false", "task.num_eval=4", "rollout.max_new_tokens=12"]
    )
    tr = GRPOTrainer(build_parts(spec, progress=False))
    bos = tr.tokenizer.bos_token_id if tr.tokenizer.bos_token_id is not None else 1
    prompts = [[bos, 5 + i, 9] for i in range(4)]
    runs = []
    for with_eval in (False, True):
        tr.generator.manual_seed(spec.seed)
        tr.set_k_policy(policy := CountingK(spec.drafter.k))
        first = tr.backend.generate(prompts, tr.sampling, tr.generator)
        if with_eval:
            assert "eval/accuracy" in tr.evaluate()
        second = tr.backend.generate(prompts, tr.sampling, tr.generator)
        runs.append((first.tokens, second.tokens, second.counters.k_per_step, policy.updates))
    assert runs[0] == runs[1]


def test_evaluate_logs_held_out_acceptance():
    """evaluate() reports the drafter's acceptance on the held-out prompts (eval/, eval_sampled/), the
    counters of the very generations it scores; a run without a drafter reports none."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.run_build import build_parts
    from workbench.specs import load_spec

    base = ["tracking.enabled=false", "task.num_eval=4", "rollout.max_new_tokens=12", "grpo.eval_sampled=true"]
    spec = load_spec("micro", ["drafter.kind=draft_model", "drafter.k=3", *base])
    tr = GRPOTrainer(build_parts(spec, progress=False))
    ev = tr.evaluate()
    for prefix in ("eval", "eval_sampled"):
        assert 1.0 <= ev[f"{prefix}/acceptance_length"] <= 4.0
        rates = [ev[f"{prefix}/acceptance_rate_pos_{i}"] for i in range(3)]
        assert rates == sorted(rates, reverse=True)  # a later position is accepted only after the earlier
        assert ev[f"{prefix}/acceptance_length"] == pytest.approx(1.0 + sum(rates))
        assert f"{prefix}/num_drafts" not in ev
    plain = GRPOTrainer(build_parts(load_spec("micro", ["drafter.kind=none", *base]), progress=False)).evaluate()
    assert "eval/accuracy" in plain and not any("acceptance" in k for k in plain)
