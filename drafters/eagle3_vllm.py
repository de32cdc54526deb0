"""EAGLE-3 heads in the checkpoint layout vLLM serves (``speculative_config.method: eagle3``).

vLLM loads an EAGLE-3 draft as ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py)
from a folder with a Llama ``config.json`` and safetensors weights; the public heads (e.g.
``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``, SpecForge exports) use the same layout:

config.json
    ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: llama``, ``num_hidden_layers: 1``;
    ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
    ``intermediate_size``, ``rms_norm_eps``, ``rope_theta`` (+ ``rope_scaling``),
    ``max_position_embeddings``, ``hidden_act: silu`` of the one decoder layer;
    ``vocab_size`` = the TARGET's vocabulary, ``draft_vocab_size`` = the head's LM-head rows;
    ``eagle_aux_hidden_state_layer_ids``: the target layers whose hidden states are fused, in vLLM's
    indexing (id j = the input of target layer j, 0 = the embeddings), which is also ours.
weights
    ``fc.weight`` (H, 3H); ``midlayer.input_layernorm.weight`` (H) on the token embedding,
    ``midlayer.hidden_norm.weight`` (H) on the feature; ``midlayer.self_attn.{q,k,v}_proj.weight``
    reading the 2H input [embedding ‖ feature], ``midlayer.self_attn.o_proj.weight``;
    ``midlayer.post_attention_layernorm.weight``; ``midlayer.mlp.{gate,up,down}_proj.weight``;
    ``norm.weight``; ``lm_head.weight`` (Vd, H);
    ``d2t`` (Vd,) int64 OFFSETS: target id = draft id + d2t[draft id] (ours stores the target ids);
    ``t2d`` (V,) bool: whether a target id is in the draft vocabulary (ours: draft id or -1).
    No ``embed_tokens``: vLLM then shares the target's embedding, as we do.

What was checked here: the names, shapes and d2t/t2d conventions against vLLM's loader source
(``Eagle3LlamaForCausalLM.load_weights``), and a round trip export -> load with identical proposals.
What could not be: loading the folder in vLLM itself (vLLM needs CUDA; not installable on these machines).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.cache import fix_for
from workbench.files import reading

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # names vLLM's registry maps to EAGLE-3


# our chain net's single draft layer (prefix) -> its modules' names in vLLM's heads (under the layer's name)
CHAIN_LAYER = (
    ("attn.0.", "self_attn."),
    ("post_attention_layernorm.0.", "post_attention_layernorm."),
    ("mlp.0.", "mlp."),
    ("input_layernorm.", "input_layernorm."),
)


def head_name(ours: str, layer: str, kept: tuple[str, ...], also: tuple[tuple[str, str], ...] = ()) -> str | None:
    """Our chain net's parameter name -> vLLM's: the draft layer's modules under ``layer`` (``also``: more
    of them), the names in ``kept`` as they are, anything else None (not in vLLM's checkpoint)."""
    for prefix, theirs in (*CHAIN_LAYER, *also):
        if ours.startswith(prefix):
            return layer + theirs + ours[len(prefix) :]
    return ours if ours in kept else None


def _layer_names(ours: str) -> str | None:
    """Our Eagle3Net parameter name -> vLLM's (the single draft layer is ``midlayer``)."""
    kept = ("fc.weight", "norm.weight", "lm_head.weight")
    return head_name(ours, "midlayer.", kept, also=(("hidden_norm.", "hidden_norm."),))


def to_vllm_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our Eagle3Net state dict -> vLLM's tensors (names above; d2t as offsets, t2d as a bool mask).

    Raises:
        ValueError: a tensor that has no place in the vLLM layout (a drafter with more than one layer).
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k in ("d2t", "t2d"):
            continue
        name = _layer_names(k)
        if name is None:
            raise ValueError(
                f"eagle3 export: {k!r} has no counterpart in vLLM's EAGLE-3 layout (one decoder layer only)"
            )
        out[name] = v.detach().cpu().contiguous()
    d2t = state["d2t"].long().cpu()
    if d2t.shape[0] == state["t2d"].shape[0] and bool((d2t == torch.arange(d2t.shape[0])).all()):
        return out  # the full vocabulary in order: vLLM then has no draft_id_to_target_id (it refuses a d2t)
    out["d2t"] = d2t - torch.arange(d2t.shape[0])  # (Vd,) offsets
    out["t2d"] = state["t2d"].cpu() >= 0  # (V,) bool
    return out


def from_vllm_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vLLM's EAGLE-3 tensors -> our Eagle3Net state dict (inverse of :func:`to_vllm_state`).

    A head without ``d2t`` drafts over the whole target vocabulary (vLLM's convention too).
    Raises:
        ValueError: a tensor we cannot place (e.g. a second layer), or d2t/t2d that disagree.
    """
    inverse = {}
    for k in state:
        if k in ("d2t", "t2d") or k.startswith("embed_tokens.") or k.startswith("model.embed_tokens."):
            continue
        name = k.removeprefix("model.")
        back = {v: o for o, v in ((o, _layer_names(o)) for o in _OURS) if v}.get(name)
        if back is None:
            raise ValueError(f"eagle3 load: weight {k!r} is not part of a one-layer EAGLE-3 head")
        inverse[back] = state[k]
    vd = inverse["lm_head.weight"].shape[0]
    offsets = state.get("d2t", torch.zeros(vd, dtype=torch.long)).long()
    d2t = torch.arange(vd) + offsets  # (Vd,) target ids
    if "t2d" in state:
        V = state["t2d"].shape[0]
        mask = state["t2d"].bool()
        if int(mask.sum()) != vd or not bool(mask[d2t].all()):
            raise ValueError("eagle3 load: d2t and t2d disagree (t2d must mark exactly the d2t target ids)")
    else:
        V = int(d2t.max()) + 1
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(vd)
    inverse["d2t"], inverse["t2d"] = d2t, t2d
    return inverse


# The parameter names of our one-layer Eagle3Net (drafters/eagle3.py), for the inverse map.
_OURS = (
    "attn.0.q_proj.weight",
    "attn.0.k_proj.weight",
    "attn.0.v_proj.weight",
    "attn.0.o_proj.weight",
    "post_attention_layernorm.0.weight",
    "mlp.0.gate_proj.weight",
    "mlp.0.up_proj.weight",
    "mlp.0.down_proj.weight",
    "fc.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "norm.weight",
    "lm_head.weight",
)


def vllm_config(cfg, layer_ids: tuple[int, ...], draft_vocab_size: int, dtype: torch.dtype) -> dict:
    """config.json of an exported head: ``cfg`` is the target's ``LMConfig`` (the head's layer has its shape)."""
    return {
        "architectures": [ARCHITECTURES[0]],
        "model_type": "llama",
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
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": int(draft_vocab_size),
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "torch_dtype": str(dtype).removeprefix("torch."),
        # e.g. a Llama 3.1 target's llama3 RoPE
        **({"rope_scaling": dict(cfg.rope_scaling)} if getattr(cfg, "rope_scaling", None) else {}),
    }


def export_eagle3(net, target_cfg, folder: str | Path) -> Path:
    """Write ``net`` (an Eagle3Net) as a vLLM EAGLE-3 folder: ``config.json`` + ``model.safetensors``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = net.state_dict()
    cfg = vllm_config(target_cfg, net.layer_ids, state["lm_head.weight"].shape[0], state["lm_head.weight"].dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(to_vllm_state(state), str(folder / "model.safetensors"))
    return folder


def head_folder(path: str | Path) -> Path:
    """``path`` as a folder: a Hugging Face Hub id (``ORG/NAME[@REVISION]``, e.g. a public head) resolved to
    its snapshot in the hub cache (:func:`workbench.models.hub.resolve_hub_model`), anything else as a path.

    Raises:
        ValueError: a Hub id that cannot be resolved (one line naming ``drafter.model``, the id, the hub
            cache and ``HF_HUB_OFFLINE``).
    """
    from workbench.models.hub import parse_hub_id, resolve_hub_model

    hub = parse_hub_id(str(path))
    return resolve_hub_model(*hub, what="drafter.model") if hub else Path(path)


def is_eagle3_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder (or a Hugging Face Hub id, :func:`head_folder`) holding a vLLM-layout
    EAGLE-3 head (by its config's architectures). Raises ValueError for a Hub id that cannot be resolved."""
    f = head_folder(path) / "config.json"
    if not f.is_file():
        return False
    try:
        return any(a in ARCHITECTURES for a in json.loads(f.read_text()).get("architectures", []))
    except (OSError, ValueError):
        return False


def read_eagle3(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, our Eagle3Net state dict) of a vLLM EAGLE-3 folder (or Hub id, :func:`head_folder`).

    Raises:
        ValueError: missing or corrupt files, or weights that are not a one-layer EAGLE-3 head.
    """
    from safetensors.torch import load_file

    folder = head_folder(folder)
    with reading(folder, "drafter.model", fix_for(folder)):
        cfg = json.loads((folder / "config.json").read_text())
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError("no *.safetensors file in it")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
    return cfg, from_vllm_state(state)
