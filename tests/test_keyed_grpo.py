"""GRPO with and without speculation under drafter-invariant sampling (``rollout.sampler=keyed``, the
workbench engine's default): the same seed gives the same rollouts, rewards, losses and weights whatever
the drafter, and the paired plain twin decodes exactly the speculative arm's completions."""

import pytest
import torch

from workbench.grpo.trainer import GRPOTrainer
from workbench.rollout.paired import twin_divergence
from workbench.run_build import build_parts
from workbench.specs import load_spec

KEYS = ("reward/mean", "loss/policy", "gen/num_tokens", "completions/max_length")


def _train(kind: str, *extra: str, steps: int = 3):
    spec = load_spec("micro", [f"drafter.kind={kind}", "grpo.eval_every=0", "drafter.init.data=none", *extra])
    tr = GRPOTrainer(build_parts(spec, progress=False))
    return tr, [tr.step(s)[0] for s in range(1, steps + 1)]


def test_twin_divergence_counts_positions_and_rows():
    assert twin_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) == {
        "gen_autoregressive/differing_tokens": 0.0,
        "gen_autoregressive/differing_rows": 0.0,
    }
    d = twin_divergence([[1, 2, 3], [4, 5], [6]], [[1, 9, 3], [4, 5, 7, 8], [6]])
    assert d["gen_autoregressive/differing_tokens"] == 3.0  # one swapped token, two the twin alone reached
    assert d["gen_autoregressive/differing_rows"] == 2.0
    with pytest.raises(ValueError, match="2 rows against the twin's 1"):
        twin_divergence([[1], [2]], [[1]])


def test_keyed_is_the_workbench_default_and_rejection_vllm_s():
    assert load_spec("micro").rollout.sampler == "keyed"
    assert load_spec("micro", ["rollout.backend=vllm"]).rollout.sampler == "rejection"
    assert load_spec("micro", ["rollout.sampler=rejection"]).rollout.sampler == "rejection"


@pytest.mark.parametrize("kind", ["ngram", "draft_model"])
def test_grpo_with_and_without_speculation_is_one_run(kind):
    plain, h_plain = _train("none")
    spec, h_spec = _train(kind)
    assert sum(m["spec/num_accepted_tokens"] for m in h_spec) > 0  # drafts were accepted: the accept path ran
    for a, b in zip(h_plain, h_spec):
        for key in KEYS:
            assert a[key] == b[key], key
    for p, q in zip(plain.policy.parameters(), spec.policy.parameters()):
        assert torch.equal(p, q)


def _eval_rows(kind: str) -> list[list[list[int]]]:
    """The completions of each arm of one held-out evaluation (greedy, then sampled), at step 0."""
    tr, _ = _train(kind, "grpo.eval_sampled=true", "task.num_eval=16", steps=0)
    arms, generate = [], tr.backend.generate
    tr.backend.generate = lambda *a, **k: arms.append(out := generate(*a, **k)) or out
    tr.evaluate()
    return [out.tokens for out in arms]


def test_sampled_evaluation_is_the_same_whatever_the_drafter():
    """Held-out evaluation at the rollouts' sampling: each prompt's own keyed seed, so the greedy arm's
    forwards (which draw from the evaluation generator, as many as the drafter makes) cannot move the
    sampled arm's rows."""
    greedy, sampled = _eval_rows("none")
    assert len(sampled) == 16 and _eval_rows("ngram") == [greedy, sampled]


def test_rejection_sampling_gives_another_run():
    _, h_plain = _train("none", "rollout.sampler=rejection")
    _, h_spec = _train("ngram", "rollout.sampler=rejection")
    assert any(a["gen/num_tokens"] != b["gen/num_tokens"] for a, b in zip(h_plain, h_spec))


def test_paired_twin_decodes_the_speculative_completions_under_keyed_only():
    _, keyed = _train("ngram", "measure.paired=true")
    assert all(m["gen_autoregressive/differing_tokens"] == 0 for m in keyed)
    assert all(m["gen_autoregressive/num_tokens"] == m["gen/num_tokens"] for m in keyed)
    _, rejection = _train("ngram", "measure.paired=true", "rollout.sampler=rejection")
    assert sum(m["gen_autoregressive/differing_rows"] for m in rejection) > 0
