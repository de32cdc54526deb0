"""EAGLE-3 heads in vLLM's checkpoint layout: names, the d2t/t2d conventions, and the round trip."""

import json

import pytest
import torch

from drafters.eagle3 import Eagle3Net, vocab_map
from drafters.eagle3_vllm import export_eagle3, from_vllm_state, is_eagle3_folder, read_eagle3, to_vllm_state
from workbench.rollout.model import LMConfig

CFG = LMConfig(
    vocab_size=64,
    hidden_size=32,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)


def net(seed=0, vd=16):
    torch.manual_seed(seed)
    counts = torch.rand(CFG.vocab_size)
    d2t, t2d = vocab_map(counts, vd)
    n = Eagle3Net(CFG, (1, 2, 3), d2t, t2d)
    for p in n.parameters():
        torch.nn.init.normal_(p)
    return n


def test_vllm_names_and_vocabulary_conventions():
    n = net()
    s = to_vllm_state(n.state_dict())
    assert {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.mlp.down_proj.weight",
        "d2t",
        "t2d",
    } <= set(s)
    assert s["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * CFG.hidden_size  # reads [embedding ‖ feature]
    # each tensor under vLLM's name for it (written out by hand from llama_eagle3.py, not from our table)
    ours = n.state_dict()
    for mine, theirs in (
        ("input_layernorm.weight", "midlayer.input_layernorm.weight"),  # on the token embedding
        ("hidden_norm.weight", "midlayer.hidden_norm.weight"),  # on the fused feature
        ("attn.0.q_proj.weight", "midlayer.self_attn.q_proj.weight"),
        ("attn.0.o_proj.weight", "midlayer.self_attn.o_proj.weight"),
        ("post_attention_layernorm.0.weight", "midlayer.post_attention_layernorm.weight"),
        ("mlp.0.gate_proj.weight", "midlayer.mlp.gate_proj.weight"),
        ("mlp.0.up_proj.weight", "midlayer.mlp.up_proj.weight"),
        ("fc.weight", "fc.weight"),
    ):
        assert torch.equal(s[theirs], ours[mine]), (mine, theirs)
    # vLLM: target id = draft id + d2t[draft id]; t2d marks the draft vocabulary
    assert torch.equal(torch.arange(16) + s["d2t"], n.d2t)
    assert s["t2d"].dtype == torch.bool and int(s["t2d"].sum()) == 16 and bool(s["t2d"][n.d2t].all())


def test_state_round_trip_is_exact():
    n = net()
    back = from_vllm_state(to_vllm_state(n.state_dict()))
    ref = n.state_dict()
    assert set(back) == set(ref)
    assert all(torch.equal(back[k], ref[k]) for k in ref)


def test_export_folder_reads_back(tmp_path):
    n = net(seed=1)
    export_eagle3(n, CFG, tmp_path / "head")
    assert is_eagle3_folder(tmp_path / "head") and not is_eagle3_folder(tmp_path)
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    assert (
        cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["vocab_size"] == 64 and cfg["draft_vocab_size"] == 16
    )
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["num_hidden_layers"] == 1
    cfg2, state = read_eagle3(tmp_path / "head")
    m = Eagle3Net(CFG, tuple(cfg2["eagle_aux_hidden_state_layer_ids"]), state["d2t"], state["t2d"])
    m.load_state_dict(state)
    x = {i: torch.randn(2, 5, 32) for i in (1, 2, 3)}
    assert torch.equal(m.fuse(x), n.fuse(x))


def test_bad_heads_are_refused(tmp_path):
    s = to_vllm_state(net().state_dict())
    with pytest.raises(ValueError, match="not part of a one-layer"):
        from_vllm_state({**s, "layers.1.mlp.up_proj.weight": torch.zeros(1)})
    bad = dict(s)
    bad["t2d"] = torch.zeros_like(s["t2d"])
    with pytest.raises(ValueError, match="disagree"):
        from_vllm_state(bad)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="drafter.model: cannot read"):
        read_eagle3(tmp_path / "x")


def test_exported_head_loads_as_drafter_model_with_the_same_proposals(tmp_path, target_lm):
    """wb drafter export -> drafter.model=<folder>: the loaded head proposes exactly what the original
    does (same draft vocabulary, layer ids, weights and q), so sampled speculative rollouts with the
    same generator are identical token for token and acceptance for acceptance (a different q or
    draft would change the rejection sampler's draws)."""
    from drafters import DrafterTarget, build_drafter
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs import DrafterSpec

    from conftest import PROMPTS

    torch.manual_seed(0)  # the head's weights: independent of the tests that ran before
    counts = torch.rand(target_lm.cfg.vocab_size, generator=torch.Generator().manual_seed(3))
    spec = DrafterSpec(kind="eagle3", draft_vocab_size=24)
    original = build_drafter("eagle3", spec, DrafterTarget(target_lm, token_counts=counts), torch.device("cpu"))
    for p in original.net.parameters():  # a trained-looking head, not the init's copy of the target's LM head
        torch.nn.init.normal_(p, std=0.2)
    export_eagle3(original.net, target_lm.cfg, tmp_path / "head")
    loaded = build_drafter(
        "eagle3",
        DrafterSpec(kind="eagle3", model=str(tmp_path / "head")),
        DrafterTarget(target_lm),
        torch.device("cpu"),
    )
    assert torch.equal(loaded.net.d2t, original.net.d2t) and loaded.net.layer_ids == original.net.layer_ids
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=2)
    outs = [
        RolloutEngine(target_lm, d, k=3).generate(PROMPTS * 4, sp, torch.Generator().manual_seed(0))
        for d in (original, loaded)
    ]
    assert outs[0].tokens == outs[1].tokens
    assert outs[0].counters.num_accepted_tokens_per_pos == outs[1].counters.num_accepted_tokens_per_pos
    assert outs[0].counters.num_draft_tokens > 0


def test_a_head_for_another_target_is_refused(tmp_path, target_lm):
    from drafters import DrafterTarget, build_drafter
    from workbench.specs import DrafterSpec

    other = LMConfig(
        **{**CFG.__dict__, "hidden_size": target_lm.cfg.hidden_size + 8, "vocab_size": target_lm.cfg.vocab_size}
    )
    d2t, t2d = vocab_map(torch.rand(other.vocab_size), 8)
    export_eagle3(Eagle3Net(other, (1, 1, 1), d2t, t2d), other, tmp_path / "head")
    with pytest.raises(ValueError, match="drafter.model: the EAGLE-3 head .* another target"):
        build_drafter(
            "eagle3",
            DrafterSpec(kind="eagle3", model=str(tmp_path / "head")),
            DrafterTarget(target_lm),
            torch.device("cpu"),
        )
