"""Fused projection weights: one (q+k+v, H) and one (2I, H) tensor per layer whose rows the
Linears' parameters view, so the in-place weight sync reaches both (the compiled step and the
packed weights run them; vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear``).
"""

from __future__ import annotations

import torch
import torch.nn as nn


def fuse(params: list[nn.Parameter]) -> torch.Tensor:
    """Concatenate the parameters (rows of weights (out, in), or biases (out,)) and make each
    parameter a view into the result."""
    fused = torch.cat([p.detach() for p in params], 0)
    off = 0
    for p in params:
        n = p.shape[0]
        p.data = fused[off : off + n]
        off += n
    return fused


def mark_static_address(t: torch.Tensor) -> None:
    """Tell cudagraph trees that ``t``'s storage never moves (the weights are synced in place), so a
    replay reads it where it is instead of copying it into a graph input first; unguarded: a tensor
    that did move (``.to()``, a replaced weight) makes torch re-record the graph, not recompile."""
    mark = getattr(torch._dynamo, "mark_static_address", None)  # torch >= 2.2
    if mark is not None:
        mark(t, guard=False)


def replaced(layer: nn.Module, fused: tuple, f_bias: torch.Tensor | None) -> bool:
    """Whether a layer's q/k/v or gate/up parameters no longer view its fused tensors (``fused``,
    ``f_bias``: its entries of ``LeanLM._fused`` and ``_fused_bias``), i.e. were replaced instead
    of copied into."""
    a, (f_qkv, f_gu) = layer.self_attn, fused
    ptr = lambda t: t.data_ptr()  # noqa: E731
    return (
        ptr(a.q_proj.weight) != ptr(f_qkv)
        or ptr(layer.mlp.gate_proj.weight) != ptr(f_gu)
        or (f_bias is not None and ptr(a.q_proj.bias) != ptr(f_bias))
    )
