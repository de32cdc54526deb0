"""Random checkpoints of each supported architecture for the parity tests (tests/test_architectures.py).

:func:`make_checkpoint` writes ``workbench.models.shapes.random_checkpoint`` of a family, patches its
config.json (a sliding window shorter than the test sequences, another RoPE scaling) and replaces
transformers' initialisation by *sharp* random weights: unit-scale projections, norm weights around
1 (not exactly 1) and non-zero biases. With transformers' own init (std 0.02, norms = 1, biases = 0)
the logits are near 0 and q_norm or a bias would change nothing, so a forward that skipped them
would still "match" (measured: RoPE-scaling, q_norm and bias bugs changed nothing or < 6e-3).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# case -> (family, config.json patch). Sequences in the tests reach position ~80 of 128: past the
# llama3 RoPE's original_max_position_embeddings (16), past the sliding windows (8), through the
# yarn/linear scalings' interpolated range.
CASES = {
    "llama": ("llama", {}),
    "llama3": ("llama3", {}),
    "llama-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    "qwen2": ("qwen2", {}),
    "qwen2-window": (
        "qwen2",
        {
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 1,
            "layer_types": ["full_attention", "sliding_attention"],
        },
    ),
    "qwen3": ("qwen3", {}),
    "qwen3-yarn": (
        "qwen3",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 1000000.0,
            }
        },
    ),
    "mistral": ("mistral", {"sliding_window": 8}),
}
SHAPE = dict(layers=2, hidden=64, heads=4, kv_heads=2, max_positions=128)


@torch.no_grad()
def sharpen(model: torch.nn.Module, seed: int) -> None:
    """In place: matrices ~ N(0, 1/fan_in) (embedding and LM head x3: confident next-token laws),
    vectors (norm weights) ~ 1 + N(0, 0.2^2), biases ~ N(0, 0.5^2)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            scale = 3.0 if ("lm_head" in name or "embed_tokens" in name) else 1.0
            p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[1] ** 0.5)
        elif name.endswith(".bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        else:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))


def make_checkpoint(folder: Path, case: str, seed: int = 0, **shape) -> Path:
    """A sharp random checkpoint of ``case`` (see :data:`CASES`) in ``folder``, float32."""
    from transformers import AutoModelForCausalLM

    from workbench.models.shapes import random_checkpoint

    arch, patch = CASES[case]
    path = random_checkpoint(arch, folder, seed=seed, **{**SHAPE, **shape})
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(patch)
    if "layer_types" in cfg:
        cfg["layer_types"] = cfg["layer_types"][: cfg["num_hidden_layers"]]
    cfg_file.write_text(json.dumps(cfg, indent=2))
    model = AutoModelForCausalLM.from_pretrained(path)
    sharpen(model, seed)
    model.save_pretrained(path)
    return path


def load_hf(path: Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
