"""DFlash heads in the checkpoint layout vLLM serves (``speculative_config.method: dflash``).

vLLM 0.32 loads a DFlash draft as ``DFlashDraftModel`` -> ``DFlashQwen3ForCausalLM``
(vllm/model_executor/models/qwen3_dflash.py; z-lab's ``*-DFlash`` checkpoints use the same layout):

config.json
    ``architectures: ["DFlashDraftModel"]``, ``model_type: qwen3``, ``num_hidden_layers: 1``, the
    layer's shape (``hidden_size``, heads, ``head_dim``, ``intermediate_size``, ``rms_norm_eps``,
    ``rope_theta``, ``max_position_embeddings``); ``vocab_size`` = the TARGET's vocabulary,
    ``draft_vocab_size`` = the head's LM-head rows; ``block_size``; ``dflash_config``:
    ``target_layer_ids`` (the target layers whose OUTPUTS are fused: vLLM reads aux hidden state
    i + 1, so ours, which name a layer's input as eagle3's do, are shifted down by one),
    ``mask_token_id`` (the input id of the block's mask slots) and ``causal: false`` (the block
    attends both ways).
weights (``model.safetensors``)
    ``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.self_attn.{q,k}_norm.weight`` (D,),
    ``layers.0.{input,post_attention}_layernorm.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
    ``fc.weight`` (H, nH), ``hidden_norm.weight``, ``norm.weight``, ``lm_head.weight`` (Vd, H),
    ``d2t`` (Vd,) int64 offsets as EAGLE-3's (target id = draft id + d2t[draft id]).
    No ``embed_tokens``: vLLM shares the target's embedding, as we do.
``mask_embedding.pt``
    ``{"mask_token_id": id, "embedding": (H,)}``, our learned mask embedding: vLLM substitutes it for
    the embedding of ``mask_token_id`` wherever that id is an input. Slot 0 (the last emitted token)
    is an input too, so the id must be one the target never emits: we take the last id of the
    vocabulary that is not a stop id.

vLLM's proposer runs a block of num_speculative_tokens + 1 slots; ours always runs its trained
``dflash_block_size`` slots (their attention is two-way, so the block's length shapes every q_i). The
two agree when k = dflash_block_size - 1, which the hand-over (:mod:`workbench.vllm.speculative`) requires.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from drafters.eagle3_vllm import head_name

ARCHITECTURE = "DFlashDraftModel"  # vLLM's registry: qwen3_dflash.DFlashQwen3ForCausalLM


def _layer_name(ours: str) -> str | None:
    """Our DFlashNet parameter name -> vLLM's (the single draft layer is ``layers.0``)."""
    return head_name(ours, "layers.0.", ("fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight"))


def to_vllm_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our DFlashNet state dict -> vLLM's tensors (module doc), the mask embedding included under
    ``mask_embedding`` (vLLM's weight reload takes it by that name once the folder shipped one).

    Raises:
        ValueError: a tensor that has no place in vLLM's one-layer DFlash layout.
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k in ("d2t", "t2d"):
            continue
        name = "mask_embedding" if k == "mask_embedding" else _layer_name(k)
        if name is None:
            raise ValueError(f"dflash export: {k!r} has no counterpart in vLLM's DFlash layout (one layer only)")
        out[name] = v.detach().cpu().contiguous()
    d2t = state["d2t"].long().cpu()
    if not (d2t.shape[0] == state["t2d"].shape[0] and bool((d2t == torch.arange(d2t.shape[0])).all())):
        out["d2t"] = d2t - torch.arange(d2t.shape[0])  # (Vd,) offsets; the full vocabulary in order ships none
    return out


def target_layer_ids(layer_ids: tuple[int, ...]) -> list[int]:
    """Our fused-layer ids (a layer's input, 0 = the embeddings) -> vLLM DFlash's ``target_layer_ids``
    (a layer's output).

    Raises:
        ValueError: id 0 (the embeddings are no layer's output).
    """
    if min(layer_ids) < 1:
        raise ValueError(
            f"dflash export: drafter.eagle_aux_hidden_state_layer_ids {list(layer_ids)} includes 0 (the embeddings), "
            "which vLLM's DFlash cannot fuse; use ids >= 1"
        )
    return [i - 1 for i in layer_ids]


def mask_token_id(vocab_size: int, stop_ids: tuple[int, ...] = ()) -> int:
    """The input id of the mask slots: the last id of the vocabulary that is not a stop id."""
    return next(i for i in range(vocab_size - 1, -1, -1) if i not in set(stop_ids))


def vllm_config(cfg, layer_ids, draft_vocab_size: int, block_size: int, mask_id: int, dtype: torch.dtype) -> dict:
    """config.json of an exported head: ``cfg`` is the target's ``LMConfig`` (the head's layer has its shape)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": int(draft_vocab_size),
        "block_size": int(block_size),
        "dflash_config": {"target_layer_ids": target_layer_ids(layer_ids), "mask_token_id": mask_id, "causal": False},
        "torch_dtype": str(dtype).removeprefix("torch."),
        **({"rope_scaling": dict(cfg.rope_scaling)} if getattr(cfg, "rope_scaling", None) else {}),
    }


def export_dflash(net, target_cfg, folder: str | Path, block_size: int, stop_ids: tuple[int, ...] = ()) -> Path:
    """Write ``net`` (a ``drafters.dflash.DFlashNet``) as a vLLM DFlash folder: ``config.json``,
    ``model.safetensors`` and ``mask_embedding.pt`` (module doc). ``stop_ids``: ids the mask id must avoid.

    Raises:
        ValueError: a fused layer id vLLM cannot express (:func:`target_layer_ids`).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = to_vllm_state(net.state_dict())
    mask = state.pop("mask_embedding")
    w = state["lm_head.weight"]
    mask_id = mask_token_id(target_cfg.vocab_size, stop_ids)
    cfg = vllm_config(target_cfg, net.layer_ids, w.shape[0], block_size, mask_id, w.dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(state, str(folder / "model.safetensors"))
    torch.save({"mask_token_id": mask_id, "embedding": mask}, folder / "mask_embedding.pt")
    return folder
