"""The rollout-backend interface (workbench.rollout.backend): the workbench engine behind it, its
paired twin, and the trainer reaching any engine only through it (issue #31)."""

import copy

import pytest
import torch

from tests.conftest import random_llama
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.rollout.workbench_backend import WorkbenchBackend


def test_workbench_backend_is_a_rollout_backend_and_generates_as_its_engine(target_hf):
    lm = LeanLM.from_hf(target_hf)
    be = WorkbenchBackend(lm, None, max_batch_size=4)
    assert isinstance(be, RolloutBackend) and be.owns_weights and be.tags == {}
    sp = SamplingParams(1.0, 1.0, 0, 8, None)
    prompts = [[1, 5, 9], [1, 7], [1, 3, 4, 5]]
    got = be.generate(prompts, sp, torch.Generator().manual_seed(3), [0, 0, 1])
    want = RolloutEngine(lm, None, max_batch_size=4).generate(prompts, sp, torch.Generator().manual_seed(3), [0, 0, 1])
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def test_twin_shares_the_target_and_loads_no_weights(target_hf):
    """The paired arm decodes with its owner's LeanLM: the owner's load refreshes both, the twin's is a no-op."""
    lm = LeanLM.from_hf(target_hf)
    be = WorkbenchBackend(lm, None, max_batch_size=4, retire_buckets=(1, 2, 4))
    twin = be.plain_twin()
    assert isinstance(twin, RolloutBackend) and not twin.owns_weights and twin.target is lm and twin.drafter is None
    assert twin.engine.retire_buckets == (1, 2, 4)
    other = random_llama(seed=5)
    twin.load_policy_weights(other)
    assert torch.equal(lm.lm_head.weight, target_hf.lm_head.weight)  # untouched by the twin
    be.load_policy_weights(other)
    assert torch.equal(lm.lm_head.weight, other.lm_head.weight)


def test_k_policy_goes_to_the_engine(target_hf):
    be = WorkbenchBackend(LeanLM.from_hf(target_hf), object(), k=2)  # any drafter object: k_policy needs one
    sentinel = object()
    be.k_policy = sentinel
    assert be.engine.k_policy is sentinel and be.k_policy is sentinel


def test_cuda_graphs_off_cuda_names_the_field(target_hf):
    with pytest.raises(ValueError, match="rollout.cuda_graphs"):
        WorkbenchBackend(LeanLM.from_hf(copy.deepcopy(target_hf)), None, cuda_graphs=True)


def test_trainer_builds_nothing_and_runs_on_given_parts(monkeypatch):
    """GRPOTrainer takes built parts and the settings they carry: no builder runs, no spec is read."""
    from workbench.grpo import build
    from workbench.grpo import trainer as trainer_mod
    from workbench.run_build import build_parts
    from workbench.specs import load_spec

    spec = load_spec(
        "micro", ["tracking.enabled=false", "drafter.kind=none", "rollout.max_new_tokens=8", "grpo.steps=1"]
    )
    parts = build_parts(spec, progress=False)
    for name in ("build_backend", "build_drafter_parts", "load_policy"):
        monkeypatch.setattr(build, name, lambda *a, **k: pytest.fail("the trainer built its own parts"))
    tr = trainer_mod.GRPOTrainer(parts)
    m, _ = tr.step(1)
    assert tr.backend is parts.backend and m["gen/num_tokens"] > 0
    assert not hasattr(tr, "spec") and tr.config.grpo is spec.grpo
