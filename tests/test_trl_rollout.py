"""TRL's GRPOTrainer rolling out through the workbench (``workbench.integrations.trl``).

A real TRL 1.16 trainer on the micro model: the adapter's greedy completions equal transformers'
``generate()`` with every drafter kind that needs no training, also after the weights moved (so
they were synced); its log-probs equal TRL's own per-token log-probs of the same completions; a
two-step ``trainer.train()`` logs the adapter's acceptance and timings through TRL's ``log()``.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("trl", reason='the TRL adapter needs trl==1.16.0: pip install -e ".[trl]"')

from workbench.integrations.trl import group_ids_of, workbench_rollout_func  # noqa: E402
from workbench.models import resolve_model  # noqa: E402

MAX_NEW = 12
PROMPTS = ["1 + 2 =", "1 + 2 =", "ab ab ab", "ab ab ab"]  # two groups of two, as TRL's sampler repeats them


def _trainer(tmp_path, rollout, model_name="micro", **config):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    path = resolve_model(model_name, progress=False)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=MAX_NEW,
        report_to=[],
        use_cpu=True,
        bf16=False,
        max_steps=2,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        seed=3,
        **config,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    data = Dataset.from_dict({"prompt": ["1 + 2 =", "ab ab ab", "3 + 4 =", "cd cd"]})
    return GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
        args=args,
        train_dataset=data,
        processing_class=tok,
        rollout_func=rollout,
    )


def _hf_greedy(model, prompt_ids, eos_ids) -> list[list[int]]:
    """transformers' generate(), one prompt at a time (no padding), up to and with the first stop id."""
    out = []
    for ids in prompt_ids:
        seq = model.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            eos_token_id=eos_ids,
            pad_token_id=eos_ids[0],
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
        out.append(seq[0, len(ids) :].tolist())
    return out


def test_group_ids_follow_runs_of_equal_prompts():
    assert group_ids_of([[1], [1], [2, 3], [2, 3], [1]]) == [0, 0, 1, 1, 2]
    assert group_ids_of([]) == []


@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix", "draft_model"])
def test_greedy_completions_equal_generate_also_after_a_step(tmp_path, drafter):
    rollout = workbench_rollout_func("micro", [f"drafter.kind={drafter}", "drafter.k=3", "tracking.enabled=false"])
    tr = _trainer(tmp_path, rollout)
    tr.temperature = 0.0  # greedy (TRL's loss would divide by it: the rollout function alone is tested here)
    before = rollout(PROMPTS, tr)
    assert before["completion_ids"] == _hf_greedy(tr.model, before["prompt_ids"], tr.eos_token_ids)
    assert before["prompt_ids"] == tr.processing_class(text=PROMPTS)["input_ids"]

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an optimiser step's worth of change, large enough to change greedy outputs
        for p in tr.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1e-3) * 0.5)
    tr.state.global_step += 1
    after = rollout(PROMPTS, tr)
    assert after["completion_ids"] == _hf_greedy(tr.model, after["prompt_ids"], tr.eos_token_ids)
    assert after["completion_ids"] != before["completion_ids"], "the weights moved: the greedy completions must too"
    if drafter != "none":
        mode = "train" if tr.model.training else "eval"  # the metrics go where TRL's log() reads them
        assert tr._metrics[mode]["spec/num_drafts"][-1] > 0 and tr._metrics[mode]["timing_s/gen"][-1] > 0


def _sampled(tmp_path, drafter, *extra):
    overrides = [f"drafter.kind={drafter}", "drafter.k=3", "tracking.enabled=false", *extra]
    rollout = workbench_rollout_func("micro", overrides)
    return rollout(PROMPTS * 2, _trainer(tmp_path / drafter, rollout, temperature=1.0))["completion_ids"]


def test_sampled_completions_are_the_same_whatever_the_drafter(tmp_path):
    """The spec's default sampler (keyed, in the workbench engine) also under TRL: the same GRPOConfig.seed
    gives the same sampled completions with and without speculation; rejection sampling does not."""
    plain = _sampled(tmp_path, "none")
    assert _sampled(tmp_path, "ngram") == plain and _sampled(tmp_path, "draft_model") == plain
    rejection = "rollout.sampler=rejection"
    assert _sampled(tmp_path, "ngram", rejection) != _sampled(tmp_path, "none", rejection)


def test_logprobs_equal_trls_own(tmp_path):
    rollout = workbench_rollout_func("micro", ["drafter.kind=ngram", "drafter.k=3", "tracking.enabled=false"])
    tr = _trainer(tmp_path, rollout, temperature=0.8)
    out = rollout(PROMPTS, tr)
    assert [len(c) for c in out["completion_ids"]] == [len(lp) for lp in out["logprobs"]]
    for p, c, lp in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            trl_lp, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, torch.ones_like(ids), len(c))
        torch.testing.assert_close(torch.tensor([lp]), trl_lp, rtol=1e-4, atol=1e-4)


def test_two_trl_steps_log_acceptance_and_timings(tmp_path):
    rollout = workbench_rollout_func("micro", ["drafter.kind=draft_model", "drafter.k=2", "tracking.enabled=false"])
    tr = _trainer(tmp_path, rollout)
    tr.train()
    logged = [h for h in tr.state.log_history if "loss" in h]
    assert len(logged) == 2
    for h in logged:
        assert h["spec/acceptance_length"] >= 1.0 and h["timing_s/gen"] > 0 and h["gen/tokens_per_s"] > 0
    assert rollout._synced_step == 1  # the weights of step 1 went into the engine before its generation


def test_refusals_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="drafter.online.enabled"):
        workbench_rollout_func("micro", ["drafter.kind=draft_model", "drafter.online.enabled=true"])
    rollout = workbench_rollout_func("micro", ["drafter.kind=ngram"])
    with pytest.raises(ValueError, match="repetition_penalty"):
        rollout(PROMPTS, _trainer(tmp_path, rollout, repetition_penalty=1.1))
    with pytest.raises(ValueError, match="min_p"):
        rollout(PROMPTS, _trainer(tmp_path, rollout, min_p=0.05))
