"""Random checkpoints in the shapes RL users train (Llama 3, Qwen2/2.5, Qwen3, Mistral), for parity tests
and for trying a shape on a laptop: `wb models init qwen3 --layers 2 --hidden 128 DIR`.

Each is a transformers ``*ForCausalLM`` with random weights and the workbench's shared tokenizer, saved
with ``save_pretrained`` so it loads wherever a Hugging Face checkpoint folder does
(``model.target=DIR``, ``drafter.model=DIR``). The config fields that distinguish the families are set
to non-default values on purpose, so a forward that ignored one would not match transformers':

- ``llama3``: ``rope_scaling`` of type ``llama3`` (Llama 3.1+), rope_theta 500000, untied embeddings;
- ``qwen2``: biases on q/k/v projections (Qwen2/2.5), tied embeddings;
- ``qwen3``: per-head RMSNorm on q and k before RoPE, ``head_dim`` != hidden / heads;
- ``mistral``: a sliding-window attention config (``sliding_window``);
- ``llama``: plain Llama (default RoPE), as the embedded presets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHS = ("llama", "llama3", "qwen2", "qwen3", "mistral")


def shape_config(
    arch: str,
    vocab_size: int,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    head_dim: int | None = None,
    max_positions: int = 512,
    special: dict[str, int] | None = None,
) -> Any:
    """The transformers config of a random ``arch`` model (see the module docstring for what each sets).

    Raises:
        ValueError: an unknown ``arch`` (lists :data:`ARCHS`), or heads not divisible by kv_heads.
    """
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if arch not in ARCHS:
        raise ValueError(f"ARCH: unknown architecture {arch!r}; allowed values: {', '.join(ARCHS)}")
    if heads % kv_heads:
        raise ValueError(f"--heads {heads} must be a multiple of --kv-heads {kv_heads}")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate or 2 * hidden,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        **(special or {}),
    )
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    if arch == "llama3":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": max(8, max_positions // 8),
        }
        return LlamaConfig(**common, rope_theta=500000.0, rope_scaling=rope, tie_word_embeddings=False)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
    if arch == "qwen3":
        hd = head_dim or max(8, 2 * hidden // heads)  # Qwen3's head_dim is its own field (128 at every size)
        return Qwen3Config(**common, head_dim=hd, rope_theta=1000000.0, tie_word_embeddings=True)
    return MistralConfig(**common, sliding_window=max_positions, tie_word_embeddings=False)


def random_checkpoint(
    arch: str,
    out: str | Path,
    seed: int = 0,
    dtype: str = "float32",
    tokenizer=None,
    min_vocab: int | None = None,
    **shape: Any,
) -> Path:
    """Write a random ``arch`` model and the tokenizer to ``out`` (``save_pretrained``); return the folder.

    ``shape``: :func:`shape_config`'s keyword arguments (layers, hidden, heads, kv_heads, ...).
    ``tokenizer``: default the workbench's shared tokenizer (the embedded presets' one), so the
    folder can be a target or a draft beside them. ``min_vocab``: a vocabulary the caller will widen
    the model to; refused before any weights are written when it is below the tokenizer's ids.

    Raises:
        ValueError: see :func:`shape_config`; ``out`` exists and is not empty; ``min_vocab`` below the
            tokenizer's ids (``out`` is then left as it was found).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.resolve import shared_tokenizer

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: give a new folder")
    existed = out.exists()
    out.mkdir(parents=True, exist_ok=True)
    (tokenizer or shared_tokenizer()).save_pretrained(out)
    shape_config(arch, 8, **shape).save_pretrained(out)  # the model type, which AutoTokenizer reads
    # Read the tokenizer back as every loader will (transformers picks the class by model type, and
    # e.g. Qwen2's adds <|endoftext|>), so the model's vocabulary covers what the folder's tokenizer makes.
    tok = AutoTokenizer.from_pretrained(out)
    special = {
        k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(tok, k) is not None
    }
    if min_vocab is not None and min_vocab < len(tok):
        for f in out.iterdir():  # nothing half-written stays behind
            f.unlink()
        if not existed:
            out.rmdir()
        raise ValueError(f"--vocab-size {min_vocab} is below the tokenizer's {len(tok)} ids: give at least {len(tok)}")
    cfg = shape_config(arch, len(tok), special=special, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype))
    model.save_pretrained(out)
    return out
