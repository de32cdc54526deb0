"""Which checkpoints the rollout engine runs: a checkpoint's config read into :class:`LMConfig`, and
everything the one forward does not implement refused by name before anything runs.

Supported (docs/design.md §10; the reference for each is transformers' modeling file of that family,
whose logits the engine matches, ``tests/test_architectures.py``):

- ``llama`` (Llama 2/3.x): RoPE default, ``linear``, ``llama3`` (Llama 3.1+) or ``yarn``, computed by
  transformers' ``ROPE_INIT_FUNCTIONS`` (:mod:`workbench.rollout.rope`);
- ``qwen2`` (Qwen2/2.5): biases on the q/k/v projections (``modeling_qwen2``: always on), tied or
  untied embeddings, sliding-window layers from ``layer_types``;
- ``qwen3`` (dense): per-head RMSNorm on q and k before RoPE (``q_norm``/``k_norm``), ``head_dim``
  independent of hidden / heads, sliding-window layers from ``layer_types``;
- ``mistral``: sliding-window attention on every layer (``sliding_window``; None = full).

Refused with a ``ValueError`` naming the field (``what`` names the spec key, e.g. ``model.target``):
another ``model_type`` (MoE variants such as ``qwen3_moe`` included), ``hidden_act`` other than
silu, expert counts, ``attention_bias`` (Llama/Qwen3 put it on o_proj too), ``mlp_bias``, a RoPE
type other than the above (``dynamic`` and ``longrope`` change with the sequence length),
``partial_rotary_factor`` < 1, per-layer RoPE parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.rollout.rope import SCALED_ROPE_TYPES

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class LMConfig:
    """The rollout model's shape. Units: tokens (positions, windows), features (sizes).

    rope_scaling: transformers' RoPE parameters of a scaled RoPE (``rope_type`` and its fields,
        without ``rope_theta``), None for the default RoPE.
    qkv_bias: biases on the q/k/v projections (Qwen2). qk_norm: per-head RMSNorm on q and k (Qwen3).
    sliding_window: the attention window in tokens (a query at position p reads keys at positions
        > p - window) on the layers in ``sliding_layers``; None = full attention everywhere.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    model_type: str = "llama"
    rope_scaling: dict | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg: Any, what: str = "model") -> "LMConfig":
        """From a transformers config (``LlamaConfig``, ``Qwen2Config``, ``Qwen3Config``,
        ``MistralConfig``; transformers 4.x ``rope_scaling``/``rope_theta`` or 5.x ``rope_parameters``).

        Raises:
            ValueError: ``{what}: ...`` naming the config field this forward does not implement
                (see the module docstring), so results would otherwise silently differ.
        """
        check_supported(cfg, what)
        theta, scaling = read_rope(cfg, what)
        heads = cfg.num_attention_heads
        window, layers = read_sliding_window(cfg)
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate_size=cfg.intermediate_size,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=theta,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            model_type=cfg.model_type,
            rope_scaling=scaling,
            qkv_bias=cfg.model_type == "qwen2",
            qk_norm=cfg.model_type == "qwen3",
            sliding_window=window,
            sliding_layers=layers,
        )

    def windows(self) -> tuple[int | None, ...]:
        """Per layer, its attention window in tokens, or None for full causal attention."""
        return tuple(self.sliding_window if i in self.sliding_layers else None for i in range(self.num_layers))

    def llama_layer(self) -> "LMConfig":
        """This shape as a plain Llama layer (same heads, head_dim, RoPE; no q/k/v bias, no q/k norm,
        full attention): the chain drafters' layer, as vLLM's ``llama_eagle3`` builds an EAGLE-3
        layer for every target (Qwen3 targets included)."""
        return dataclasses.replace(
            self, model_type="llama", qkv_bias=False, qk_norm=False, sliding_window=None, sliding_layers=()
        )


def _refuse(what: str, model_type: str, field: str, value: Any, hint: str) -> ValueError:
    return ValueError(
        f"{what}: config field {field}={value!r} ({model_type}) is not supported by the workbench engine; {hint}"
    )


def check_supported(cfg: Any, what: str = "model") -> None:
    """Refuse a config whose architecture the engine's forward does not implement exactly.

    Raises:
        ValueError: naming ``what`` and the offending config field and value.
    """
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise _refuse(what, mt, "model_type", mt, f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (dense)")
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise _refuse(what, mt, "hidden_act", act, "supported: silu (SwiGLU MLP)")
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(cfg, field, None):
            raise _refuse(what, mt, field, getattr(cfg, field), "mixture-of-experts layers are not implemented")
    # Llama and Qwen3 read attention_bias for q, k, v AND o_proj (modeling_llama/modeling_qwen3);
    # Qwen2's q/k/v biases are structural (always on) and Mistral has none.
    if mt in ("llama", "qwen3") and getattr(cfg, "attention_bias", False):
        raise _refuse(what, mt, "attention_bias", True, "biases on o_proj are not implemented")
    if getattr(cfg, "mlp_bias", False):
        raise _refuse(what, mt, "mlp_bias", True, "MLP biases are not implemented")


def read_rope(cfg: Any, what: str = "model") -> tuple[float, dict | None]:
    """(rope_theta, scaling parameters or None for the default RoPE) from transformers 5.x
    ``rope_parameters`` (theta inside) or 4.x ``rope_scaling`` + ``rope_theta``.

    Raises:
        ValueError: an unsupported ``rope_type``, ``partial_rotary_factor`` < 1, or RoPE
            parameters per layer type.
    """
    mt = getattr(cfg, "model_type", None)
    params: dict = {}
    for name in ("rope_scaling", "rope_parameters"):  # 5.x aliases the two; 4.x has rope_scaling only
        value = getattr(cfg, name, None)
        if isinstance(value, dict):
            params.update(value)
    # the field's name in this version
    src = "rope_parameters" if isinstance(getattr(cfg, "rope_parameters", None), dict) else "rope_scaling"
    if any(isinstance(v, dict) for v in params.values()):
        raise _refuse(what, mt, src, params, "RoPE parameters per layer type are not implemented")
    theta = float(params.pop("rope_theta", None) or getattr(cfg, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type", params.get("type")) or "default"
    partial = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise _refuse(what, mt, "partial_rotary_factor", partial, "RoPE on part of the head dim is not implemented")
    if rope_type == "default":
        return theta, None
    if rope_type not in SCALED_ROPE_TYPES:
        raise _refuse(what, mt, f"{src}.rope_type", rope_type, f"supported: default, {', '.join(SCALED_ROPE_TYPES)}")
    params.pop("type", None)
    params.pop("partial_rotary_factor", None)
    return theta, {**params, "rope_type": rope_type}


def read_sliding_window(cfg: Any) -> tuple[int | None, tuple[int, ...]]:
    """(window in tokens or None, the layers that use it): Mistral windows every layer
    (``modeling_mistral``); Qwen2/Qwen3 the layers whose ``layer_types`` entry is
    ``sliding_attention`` (derived as transformers 5 does when a 4.x config lacks it: layers
    >= ``max_window_layers`` when ``use_sliding_window``); Llama none."""
    mt, window = cfg.model_type, getattr(cfg, "sliding_window", None)
    n = cfg.num_hidden_layers
    if mt == "mistral":
        return (int(window), tuple(range(n))) if window else (None, ())
    if mt not in ("qwen2", "qwen3") or not window:
        return None, ()
    types = getattr(cfg, "layer_types", None)
    if types is None:
        on = getattr(cfg, "use_sliding_window", False)
        types = [
            "sliding_attention" if on and i >= getattr(cfg, "max_window_layers", n) else "full_attention"
            for i in range(n)
        ]
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return (int(window), layers) if layers else (None, ())
