"""Drafter initialisation (`wb drafter init`, cached checkpoints) and online adaptation through the
CLI on the micro spec; online adaptation never touches the policy's gradients or weights."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from workbench.cli import app
from workbench.run_build import build_parts
from workbench.specs import load_spec

runner = CliRunner()
FAST = ["drafter.init.steps=8", "drafter.init.num_prompts=24", "grpo.eval_every=0"]


def _checkpoint_from(output: str) -> Path:
    line = [x for x in output.splitlines() if x.startswith("checkpoint:")][0]
    return Path(line.split("checkpoint:")[1].strip())


@pytest.mark.parametrize("kind", ["mtp", "eagle3", "draft_model"])
def test_drafter_init_builds_once_and_is_cached(store, kind):
    args = ["drafter", "init", "micro", f"drafter.kind={kind}", "drafter.init.data=in_domain", *FAST]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    folder = _checkpoint_from(res.output)
    info = json.loads((folder / "init_info.json").read_text())
    assert info["kind"] == kind and info["data"] == "in_domain" and info["num_sequences"] == 24
    assert "draft/top1_agreement" in info["held_out_after"]
    mtime = (folder / "init_info.json").stat().st_mtime
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and _checkpoint_from(again.output) == folder
    assert (folder / "init_info.json").stat().st_mtime == mtime  # reused, not rebuilt
    other = runner.invoke(app, [*args, "drafter.init.data=chat"])
    assert other.exit_code == 0 and _checkpoint_from(other.output) != folder


@pytest.mark.parametrize(
    "args,needle",
    [
        (["drafter.kind=ngram"], "drafter.init.data"),
        (["drafter.kind=mtp", "drafter.init.data=/no/such/file.jsonl"], "drafter.init.data"),
    ],
)
def test_drafter_init_bad_input_is_a_clear_error(store, args, needle):
    res = runner.invoke(app, ["drafter", "init", "micro", *args, *FAST])
    assert res.exit_code == 2 and needle in res.output


def test_drafter_init_dataset_without_the_prompt_field_is_a_clear_error(store, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"question": "1 + 2"}\n{"question": "3 * 4"}\n')
    res = runner.invoke(app, ["drafter", "init", "micro", "drafter.kind=mtp", f"drafter.init.data={data}", *FAST])
    assert res.exit_code == 2 and "drafter.init.prompt_field" in res.output and "question" in res.output


def test_online_on_a_drafter_without_weights_is_a_clear_error(store):
    res = runner.invoke(app, ["run", "micro", "drafter.kind=ngram", "drafter.online.enabled=true", "--quiet"])
    assert res.exit_code == 2 and "drafter.online.enabled" in res.output


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "draft_model"])
def test_wb_run_with_init_and_online_logs_drafter_metrics(store, kind):
    res = runner.invoke(
        app,
        [
            "run",
            "micro",
            f"drafter.kind={kind}",
            "drafter.init.data=in_domain",
            "drafter.online.enabled=true",
            "drafter.online.steps=2",
            *FAST,
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    run = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])[0]
    assert run.info.status == "FINISHED"
    m = run.data.metrics
    for key in (
        "draft/loss",
        "draft/top1_agreement",
        "timing_s/draft_train",
        "spec/acceptance_length",
        "draft_init/top1_agreement",
    ):
        assert key in m, key
    assert [x.step for x in store.get_metric_history(run.info.run_id, "draft/loss")] == [1, 2]
    assert (
        run.data.params["drafter.online.enabled"] == "True"
        and run.data.params["drafter.init.resolved_data"] == "in_domain"
    )
    arts = {a.path for a in store.list_artifacts(run.info.run_id, "drafter")}
    assert "drafter/init_info.json" in arts
    assert arts & {"drafter/model.safetensors", "drafter/drafter_config.json", "drafter/config.json"}


@pytest.mark.parametrize("kind", ["eagle3", "draft_model"])
def test_online_adaptation_leaves_policy_gradients_and_weights_unchanged(store, monkeypatch, kind):
    from workbench.grpo import trainer as trainer_mod
    from workbench.grpo.online import OnlineAdaptation

    # micro's rewards are all 0, a batch without signal (no backward at all): advantages +-1, so the policy gets
    # gradients
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, G, **kw: torch.tensor([1.0, -1.0]).repeat(len(r) // 2)
    )
    spec = load_spec(
        "micro",
        [
            f"drafter.kind={kind}",
            "drafter.init.data=none",
            "drafter.online.enabled=true",
            "drafter.online.steps=3",
            "grpo.eval_every=0",
            "tracking.enabled=false",
        ],
    )
    tr = trainer_mod.GRPOTrainer(build_parts(spec, progress=False))
    seen = {}
    real_update = OnlineAdaptation.update

    def spy(self, step, batch):
        seen["grads"] = [None if p.grad is None else p.grad.clone() for p in tr.policy.parameters()]
        seen["weights"] = [p.detach().clone() for p in tr.policy.parameters()]
        seen["drafter"] = [p.detach().clone() for p in self.drafter.train_parameters()]
        assert all(not h.requires_grad for h in batch.hidden.values()) and not batch.target_logits.requires_grad
        out = real_update(self, step, batch)
        seen["after"] = [None if p.grad is None else p.grad.clone() for p in tr.policy.parameters()]
        return out

    monkeypatch.setattr(OnlineAdaptation, "update", spy)
    metrics, _ = tr.step(1)
    assert "draft/loss" in metrics and metrics["timing_s/draft_train"] > 0
    assert any(g is not None for g in seen["grads"])  # the policy did get GRPO gradients in `train`
    for g0, g1 in zip(seen["grads"], seen["after"]):
        assert (g0 is None and g1 is None) or torch.equal(g0, g1)
    for w0, p in zip(seen["weights"], tr.policy.parameters()):
        assert torch.equal(w0, p.detach())
    changed = [not torch.equal(a, b.detach()) for a, b in zip(seen["drafter"], tr.drafter.train_parameters())]
    assert any(changed)  # the drafter itself did learn


def test_init_folder_depends_on_the_target_dtype():
    """A drafter initialised on a bfloat16 target's outputs is not reused for a float32 run (and
    float32 keys stay as they were, so existing caches remain valid)."""
    from workbench.drafter_init import init_folder
    from workbench.models import resolve_model
    from workbench.specs.load import load_spec
    from workbench.specs.resolve import drafter_init_config

    spec = load_spec("micro", ["drafter.kind=eagle3"])
    path = resolve_model(spec.model.target, what="model.target")
    folder = lambda *o: init_folder(drafter_init_config(load_spec("micro", ["drafter.kind=eagle3", *o])), path)  # noqa: E731
    f32, bf16 = folder(), folder("model.dtype=bfloat16")
    assert f32 is not None and bf16 is not None and f32 != bf16
    assert folder("model.dtype=float32") == f32


def test_init_seed_shares_one_drafter_across_run_seeds():
    """drafter.init.seed pins the init (a seed sweep reuses one drafter); null keeps the run's seed, and
    the folder of a null init seed is the one existing caches have (the key is unchanged)."""
    from workbench.drafter_init import init_folder
    from workbench.models import resolve_model
    from workbench.specs.load import load_spec
    from workbench.specs.resolve import drafter_init_config

    path = resolve_model("micro", what="model.target")
    f = lambda *o: init_folder(drafter_init_config(load_spec("micro", ["drafter.kind=eagle3", *o])), path)  # noqa: E731
    assert f("seed=1") != f("seed=0")  # null: one drafter per run seed, as before
    assert f("seed=1", "drafter.init.seed=0") == f("seed=0") == f("seed=0", "drafter.init.seed=0")
    assert f("seed=3", "drafter.init.seed=7") == f("seed=7")
    assert (
        drafter_init_config(load_spec("micro", ["seed=5"])).seed == 5
        and drafter_init_config(load_spec("micro", ["seed=5", "drafter.init.seed=2"])).seed == 2
    )


def test_in_domain_init_prompts_are_not_a_run_seeds_prompts():
    """An init shared across run seeds (drafter.init.seed=0) once drew the train stream of run seed 1, so
    that run's rollouts were the init's own prompts; no run seed's first prompts (nor any eval prompt) are
    init prompts now."""
    from workbench.drafter_init import init_prompts
    from workbench.grpo.build import load_data
    from workbench.models import resolve_model
    from workbench.models.chat import run_prompt_format
    from workbench.models.checkpoint import load_tokenizer
    from workbench.specs.resolve import drafter_init_config

    spec = load_spec("micro", ["drafter.kind=eagle3", "drafter.init.seed=0", "drafter.init.num_prompts=64"])
    tok = load_tokenizer(resolve_model("micro", what="model.target"))
    init = {tuple(p) for p in init_prompts(drafter_init_config(spec), tok)}
    assert len(init) > 32
    for seed in range(4):
        s = load_spec("micro", [f"seed={seed}", "task.num_train=64", "task.num_eval=64"])
        _, train, evals = load_data(s.task, s.seed)
        fmt = run_prompt_format(spec.task, tok)
        assert sum(tuple(fmt.encode(p)) in init for p in train["prompt"]) <= 1, seed  # chance repeats only
        assert not any(tuple(fmt.encode(p)) in init for p in evals["prompt"]), seed


def test_draft_model_from_the_targets_first_layers(store):
    """drafter.draft_layers: the draft model is the target's embeddings + first N layers + norm + head,
    distilled by the init (auto in_domain); its weights are the target's before training."""
    from drafters import DrafterTarget, build_drafter
    from workbench.models import load_model, resolve_model
    from workbench.rollout.model import LeanLM
    from workbench.specs import DrafterSpec

    path = resolve_model("micro")
    hf, tok = load_model(path)
    lm = LeanLM.from_hf(hf)
    spec = DrafterSpec(kind="draft_model", draft_layers=1)
    assert spec.init_data() == "in_domain" and DrafterSpec(kind="draft_model").init_data() == "none"
    d = build_drafter("draft_model", spec, DrafterTarget(lm, tok, path=path), torch.device("cpu"))
    assert d.hf.config.num_hidden_layers == 1
    assert torch.equal(d.hf.model.layers[0].mlp.up_proj.weight, hf.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(d.hf.model.norm.weight, hf.model.norm.weight)
    with pytest.raises(ValueError, match=r"drafter\.draft_layers: .* not below the target's"):
        build_drafter(
            "draft_model",
            DrafterSpec(kind="draft_model", draft_layers=hf.config.num_hidden_layers),
            DrafterTarget(lm, tok, path=path),
            torch.device("cpu"),
        )
    res = runner.invoke(app, ["drafter", "init", "micro", "drafter.kind=draft_model", "drafter.draft_layers=1", *FAST])
    assert res.exit_code == 0, res.output
    info = json.loads((_checkpoint_from(res.output) / "init_info.json").read_text())
    assert info["data"] == "in_domain" and info["held_out_after"]["draft/loss"] < info["held_out_before"]["draft/loss"]


def test_init_completions_are_generated_once_and_shared_across_drafter_kinds(store, monkeypatch):
    """Two kinds initialised on the same prompts, sampling and seed learn from the same cached
    completions: the second init generates nothing."""
    from workbench.cache import cache_dir
    from workbench.rollout.engine import RolloutEngine

    args = ["drafter", "init", "micro", "drafter.init.data=in_domain", "drafter.init.seed=11", *FAST]
    before = set((cache_dir() / "drafters").glob("completions-*.json"))
    assert runner.invoke(app, [*args, "drafter.kind=mtp"]).exit_code == 0
    files = set((cache_dir() / "drafters").glob("completions-*.json")) - before
    assert len(files) == 1 and len(json.loads(files.pop().read_text())) == 24

    def no_generation(*a, **kw):
        raise AssertionError("the completions were generated again")

    monkeypatch.setattr(RolloutEngine, "generate", no_generation)
    res = runner.invoke(app, [*args, "drafter.kind=eagle3"])
    assert res.exit_code == 0, res.output
    assert json.loads((_checkpoint_from(res.output) / "init_info.json").read_text())["num_sequences"] == 24
    other = runner.invoke(app, [*args, "drafter.kind=eagle3", "drafter.init.seed=12"])  # other prompts: generates
    assert isinstance(other.exception, AssertionError) and "generated again" in str(other.exception)


@pytest.mark.slow
@pytest.mark.parametrize(
    "online", [False]
)  # the adapted arm runs the same measuring code through OnlineAdaptation.update
def test_drafter_drift_measures_the_drafter_on_fresh_rollouts_and_the_policys_kl_from_init(store, monkeypatch, online):
    """measure.drafter_drift: a frozen drafter (or an adapted one) is measured on each step's rollouts before any
    drafter training, and the policy's KL from its initial weights is 0 at step 1 (it has not moved yet) and > 0
    after one optimiser step; the frozen drafter itself never changes, and the loss is unchanged by the reference."""
    from workbench.grpo import trainer as trainer_mod

    # micro's rewards are all 0 (no signal, no step): advantages +-1 instead, so the policy moves
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, G, **kw: torch.tensor([1.0, -1.0]).repeat(len(r) // 2)
    )
    spec = load_spec(
        "micro",
        [
            "drafter.kind=eagle3",
            "drafter.init.data=none",
            f"drafter.online.enabled={online}",
            "measure.drafter_drift=true",
            "grpo.eval_every=0",
            "tracking.enabled=false",
            "measure.modeled=false",
            "grpo.lr=1e-2",
        ],
    )
    tr = trainer_mod.GRPOTrainer(build_parts(spec, progress=False))
    assert tr.ref is not None and spec.grpo.beta == 0.0
    before = [p.detach().clone() for p in tr.drafter.train_parameters()]
    kls = []
    for step in (1, 2, 3):
        m, _ = tr.step(step)
        assert 0.0 <= m["draft/top1_agreement"] <= 1.0 and m["draft/heldout_loss"] > 0.0
        assert ("draft/loss" in m) == online
        kls.append(m["policy/kl_from_init"])
    assert kls[0] == pytest.approx(0.0, abs=1e-6)
    assert kls[1] > 1e-5 and kls[2] > kls[1], kls  # the policy moves away from its start
    frozen = all(torch.equal(a, b.detach()) for a, b in zip(before, tr.drafter.train_parameters()))
    assert frozen != online
