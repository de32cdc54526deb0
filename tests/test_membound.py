"""The memory-bound preset pair (issue #22): Net2Net growth of tiny is function-preserving, the presets
are sized as promised, and a grown target + its draft build through the preset machinery (a reduced
recipe grown from micro: building the real membound pair is a user/benchmark action, minutes)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from workbench.models import hashes, layout, resolve
from workbench.models.checkpoint import build_info, load_model
from workbench.models.config import make_config
from workbench.models.grow import grow_into, growth_factors
from workbench.models.presets import PRESETS, ModelPreset, Recipe, _llama, count_params, get_preset


@pytest.fixture(scope="module")
def tiny():
    return load_model(resolve.resolve_model("tiny", progress=False))  # shipped: no build


def _grown(src, tok, preset: ModelPreset, jitter: float):
    torch.manual_seed(1)  # the fresh weights grow_into must overwrite, everywhere
    dst = LlamaForCausalLM(make_config(preset, tok)).eval()
    info = grow_into(dst, src, jitter=jitter, seed=0)
    return dst, info


@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_growing_tiny_into_membound_preserves_its_logits(tiny, jitter):
    """membound's config grown from tiny computes tiny's logits (ragged, left-padded prompts with an
    attention mask, and plain text), to float32 tolerance: 4x the channels, heads and MLP units, 2x
    the layers (identity blocks), split outgoing weights, the final norm splitting the tied head."""
    src, tok = tiny
    dst, info = _grown(src, tok, get_preset("membound"), jitter)
    assert info == {"width_factor": 4, "intermediate_factor": 4, "depth_factor": 2, "identity_blocks": [1, 3, 5, 7]}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tok), (3, 40), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :7] = 0  # left padding
    with torch.no_grad():
        for kw in ({"input_ids": ids}, {"input_ids": ids, "attention_mask": attn}):
            a, b = src(**kw).logits, dst(**kw).logits
            keep = attn.bool() if "attention_mask" in kw else torch.ones_like(ids, dtype=torch.bool)
            assert (a - b)[keep].abs().max().item() < 1e-3 * a.abs().max().item()
    for i in info["identity_blocks"]:
        layer = dst.model.layers[i]
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()


def test_jitter_breaks_the_symmetry_of_copies(tiny):
    """Even splits leave copies identical (their gradients would be too); jittered splits do not,
    while the copies' outputs (heads, units) still equal the source's."""
    src, tok = tiny
    even, _ = _grown(src, tok, get_preset("membound"), 0.0)
    jit, _ = _grown(src, tok, get_preset("membound"), 0.1)
    hd = 32
    for model, same in ((even, True), (jit, False)):
        q = model.model.layers[0].self_attn.q_proj.weight  # rows: head copies 0..3 of tiny's head 0
        assert torch.equal(q[:hd], q[hd : 2 * hd]) == same
        up = model.model.layers[0].mlp.up_proj.weight  # rows 0..3: copies of tiny's unit 0
        assert torch.equal(up[0], up[1]) == same
    # every split column sums back to the source's (here: q_proj's input channel 0 of head 0's first row)
    q_src = src.model.layers[0].self_attn.q_proj.weight
    q_jit = jit.model.layers[0].self_attn.q_proj.weight
    assert torch.allclose(q_jit[0, :4].sum(), q_src[0, 0], atol=1e-6)


def test_growth_factors_refuse_configs_that_are_not_a_growth(tiny):
    src, tok = tiny
    bad = ModelPreset("bad", "target", _llama(384, 8, 16, 8, 1536), Recipe(steps=1, batch_size=1, lr=1.0))
    with pytest.raises(ValueError, match=r"cannot grow: heads 16/8 are not 3 x"):
        growth_factors(src.config, make_config(bad, tok))
    bad = ModelPreset("bad", "target", _llama(512, 6, 16, 8, 1000), Recipe(steps=1, batch_size=1, lr=1.0))
    with pytest.raises(ValueError, match=r"intermediate_size 1000 is not a multiple of 384.*num_hidden_layers 6"):
        growth_factors(src.config, make_config(bad, tok))


def test_membound_presets_are_sized_as_promised():
    t, d = get_preset("membound"), get_preset("membound-draft")
    assert t.role == "target" and t.recipe.grow_from == "tiny" and d.distill_from == "membound"
    assert 15e6 <= count_params(t) <= 30e6
    assert count_params(d) <= 0.2 * count_params(t)  # its forward: a fraction of the target's weights to read
    # the grow fields are hashed only where used: the shipped presets' hashes (and folders) stayed put
    assert "grow_from" not in get_preset("tiny").to_dict()["recipe"]
    assert t.to_dict()["recipe"]["grow_from"] == "tiny"


def test_a_grown_target_hashes_its_source(monkeypatch):
    h = hashes.preset_hash(get_preset("membound"))
    hd = hashes.preset_hash(get_preset("membound-draft"))
    tiny = get_preset("tiny")
    monkeypatch.setitem(
        PRESETS,
        "tiny",
        ModelPreset(
            tiny.name, tiny.role, tiny.config, Recipe(**{**tiny.recipe.__dict__, "steps": 1}), tiny.description
        ),
    )
    assert hashes.preset_hash(get_preset("membound")) != h and hashes.preset_hash(get_preset("membound-draft")) != hd


def test_a_grown_target_and_its_draft_build_through_resolve(monkeypatch):
    """The build machinery end to end on a reduced recipe: micro (2 x 64, shipped) grown to 4 x 128,
    trained 3 steps, and a 1-layer draft distilled from it; build_info records the growth."""
    monkeypatch.setitem(
        PRESETS,
        "membound",
        ModelPreset(
            "membound",
            "target",
            _llama(128, 4, 8, 4, 256),
            Recipe(
                steps=3,
                batch_size=4,
                lr=1e-4,
                warmup_steps=1,
                eval_every=3,
                eval_prompts=4,
                final_eval_prompts=4,
                max_new_tokens=16,
                grow_from="micro",
            ),
            "reduced membound for the test",
        ),
    )
    monkeypatch.setitem(
        PRESETS,
        "membound-draft",
        ModelPreset(
            "membound-draft",
            "draft",
            _llama(128, 1, 8, 4, 256),
            Recipe(steps=3, batch_size=4, lr=1e-3, warmup_steps=1, distill_from="membound", eval_prompts=4),
            "reduced draft",
        ),
    )
    draft_dir = resolve.resolve_model("membound-draft", progress=False)
    target_dir = layout.preset_dir("membound")
    assert layout.is_built("membound") and target_dir.parent == draft_dir.parent
    info = build_info(target_dir)
    assert (
        info["grow_from"] == "micro" and info["teacher_dir"] == str(layout.preset_dir("micro")) and info["steps"] == 3
    )
    assert (
        info["growth"]["width_factor"] == 2
        and info["growth"]["depth_factor"] == 2
        and info["growth"]["max_abs_logit_diff"] < 1e-3
    )
    assert 0.0 < info["source_agreement"]["alpha"] <= 1.0 and 0.0 <= info["final_eval_accuracy"] <= 1.0
    assert info["params"] == count_params(get_preset("membound"))
    dinfo = build_info(draft_dir)
    assert dinfo["distill_from"] == "membound" and dinfo["init_tensors_from_target"] > 0 and 0.0 < dinfo["alpha"] <= 1.0
    model, _ = load_model(target_dir)
    assert model.config.num_hidden_layers == 4 and model.config.hidden_size == 128
