"""Model and hardware presets for ``wb simulate``, and a model shape from any Hugging Face ``config.json``.

Model presets are the published ``config.json`` values of the checkpoints (the seeds' models,
docs/design.md §6). Hardware presets are per GPU, from the vendors' datasheets: *dense* bf16 tensor FLOP/s
(datasheets print the 2:4-sparse figure, twice the dense one), HBM bandwidth (bytes/s) and capacity
(bytes), NVLink bandwidth per direction (bytes/s; datasheets print the bidirectional total, twice
that) and the GPUs one NVLink domain joins. Values are plain numbers so a scenario can override any.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------ models (HF config.json values)

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-8B config.json: Qwen3ForCausalLM, 36 layers, hidden 4096, intermediate 12288,
    # 32 query heads, 8 KV heads, head_dim 128, vocab 151936, tie_word_embeddings false
    # (checked against Megatron args in THUDM/slime scripts/models/qwen3-8B.sh).
    "qwen3-8b": dict(
        layers=36,
        hidden=4096,
        intermediate=12288,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=False,
    ),
    # Qwen/Qwen3-235B-A22B config.json: Qwen3MoeForCausalLM, 94 layers, hidden 4096, 64 query heads,
    # 4 KV heads, head_dim 128, vocab 151936, 128 experts, 8 per token, moe_intermediate_size 1536,
    # every layer sparse (decoder_sparse_step 1, mlp_only_layers []), no shared expert, untied
    # (checked against slime scripts/models/qwen3-235B-A22B.sh: --num-experts 128 --moe-router-topk 8
    # --moe-ffn-hidden-size 1536).
    "qwen3-235b-a22b": dict(
        layers=94,
        hidden=4096,
        intermediate=12288,
        heads=64,
        kv_heads=4,
        head_dim=128,
        vocab=151936,
        experts=128,
        experts_per_token=8,
        moe_intermediate=1536,
        tied_embeddings=False,
    ),
    # Qwen/Qwen3-0.6B config.json (a draft_model for the Qwen3 family: same tokenizer): 28 layers,
    # hidden 1024, intermediate 3072, 16 heads, 8 KV heads, head_dim 128, tied embeddings.
    "qwen3-0.6b": dict(
        layers=28,
        hidden=1024,
        intermediate=3072,
        heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
    ),
}

# ------------------------------------------------------------------ hardware (per GPU, datasheets)

HARDWARE_PRESETS: dict[str, dict[str, Any]] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: BF16 1,979 TFLOPS with sparsity (989 dense),
    # 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (bidirectional), HGX: 8 GPUs per NVLink domain.
    "h100-sxm": dict(flops=989e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9, link_bandwidth=450e9, gpus_per_node=8),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS sparse (989 dense), 141 GB HBM3e
    # at 4.8 TB/s, NVLink 900 GB/s, HGX H200: 8 GPUs.
    "h200": dict(flops=989e12, hbm_bandwidth=4.8e12, hbm_bytes=141e9, link_bandwidth=450e9, gpus_per_node=8),
    # NVIDIA HGX B200 datasheet (8 GPUs): FP16/BF16 36 PFLOPS sparse (2.25 PF dense per GPU),
    # 1.44 TB HBM3e (180 GB per GPU) at 62 TB/s (7.7 TB/s per GPU), NVLink 5: 1.8 TB/s per GPU.
    "b200": dict(flops=2.25e15, hbm_bandwidth=7.7e12, hbm_bytes=180e9, link_bandwidth=900e9, gpus_per_node=8),
    # NVIDIA GB200 NVL72 datasheet (72 Blackwell GPUs): FP16/BF16 360 PFLOPS sparse (2.5 PF dense per
    # GPU), up to 13.4 TB HBM3e (186 GB per GPU) at 576 TB/s (8 TB/s per GPU), NVLink 130 TB/s
    # (1.8 TB/s per GPU), one NVLink domain of 72 GPUs.
    "gb200": dict(flops=2.5e15, hbm_bandwidth=8.0e12, hbm_bytes=186e9, link_bandwidth=900e9, gpus_per_node=72),
}


def model_from_hf_config(path: str | Path) -> dict[str, Any]:
    """The model-shape fields of a Hugging Face ``config.json`` (dense or MoE: Llama, Qwen2/3, Qwen3-MoE,
    Mixtral names). ``head_dim`` defaults to hidden / heads, ``num_key_value_heads`` to heads.

    Raises:
        OSError: the file cannot be read. ValueError: not JSON, or a required key is missing (named).
    """
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not a JSON config.json ({e})") from None
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM under text_config
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ValueError(f"{p}: config.json lacks {', '.join(missing)} (a decoder-only LM config has them)")
    heads = int(cfg["num_attention_heads"])
    out: dict[str, Any] = dict(
        layers=int(cfg["num_hidden_layers"]),
        hidden=int(cfg["hidden_size"]),
        intermediate=int(cfg["intermediate_size"]),
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        vocab=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if experts:
        out.update(
            experts=int(experts),
            experts_per_token=int(cfg.get("num_experts_per_tok", 1)),
            moe_intermediate=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        )
    return out
