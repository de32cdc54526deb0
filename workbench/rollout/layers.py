"""Building blocks of a Llama-family decoder layer, shared by the rollout model and the chain drafters.

Pure functions over plain tensors, so that one forward serves eager mode and ``torch.compile``
(:func:`workbench.rollout.model.lm_forward`) and the chain drafters (``mtp``, ``eagle3``) run the
very same maths as the target; and the small modules that hold their weights under Hugging Face's
parameter names. The references are transformers' ``modeling_llama``, ``modeling_qwen2``,
``modeling_qwen3`` and ``modeling_mistral`` (the rollout model's logits are tested against each,
``tests/test_architectures.py``): RMSNorm (Zhang & Sennrich 2019, statistics in float32), rotary
position embeddings (:mod:`workbench.rollout.rope`), grouped-query attention over a preallocated KV
cache under a position mask (causal, or causal within a sliding window: Mistral), optional q/k/v
biases (Qwen2) and per-head q/k RMSNorm before RoPE (Qwen3), and the SwiGLU MLP (Shazeer 2020).

Shapes: B rows, T new positions per row, Tk attended key positions, H query heads, Hkv key/value
heads, D head dim, P the position table length (``max_position_embeddings``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.rollout.rope import apply_rope, rope_cos_sin, rope_tables, rotate_half  # noqa: F401  (importable from here)

# kv(k, v) -> (keys, vals, mask): stores the new keys/values (B, T, Hkv, D) wherever the caller
# keeps them and returns what the queries attend to: keys, vals (B, Tk, Hkv, D) and a bool mask
# (B or 1, 1, T, Tk), True = may attend.
KVFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# A projection weight: one (out, in) tensor, or a tuple of them whose outputs are the parts (and
# likewise its bias: one (out,) tensor, a tuple of them, or None).
Weight = torch.Tensor | tuple[torch.Tensor, ...]
Bias = torch.Tensor | tuple[torch.Tensor, ...] | None


# Prepacked weights (LeanLM.enable_prepack, rollout.prepack_weights): id(weight) -> its _Packed entry. Why: on CPUs
# the GEMM on a weight as stored costs ~3x a packed one at 16 rows (MKL's packed sgemm,
# benchmarks/ab-prepack-membound-cpu.md; oneDNN's, used here: membound's plain decoding at 16 rows 1.11x [1.03, 1.20]
# faster, paired, docs/results/engine-profile-cpu.md); vLLM-CPU packs every weight for oneDNN when it loads a model.
# An entry remembers the version counters of the weight and of the tensors it was built from (a fused q/k/v weight's
# parameters are views with counters of their own); every in-place write (the weight sync's copy_, an optimiser step)
# moves one, so a packed copy is never used stale: it is packed again at the next call.
_PACKED: dict[int, "_Packed"] = {}
# Default for the fewest rows (tokens) per call at which a packed weight runs packed; below it F.linear runs: on the
# 2-core CPU the packed kernel lost at 1 row (membound decode step 14.3 vs 10.7 ms) and tied at 4, won at 16 (21.1 vs
# 28.3 ms; medians, the first run of benchmarks/profile-engines-membound-prepacked-cpu.md, commit 4333027). Where it
# crosses depends on the weight's shape (SmolLM2's q/k/v win from 4 rows, its down projection only at 16:
# benchmarks/ab-prepack-onednn-smollm2-cpu.md), so wb measures it per shape
# (workbench.prepack_rows) and passes it to prepack().
PACKED_MIN_ROWS = 8


class _Packed:
    __slots__ = ("ref", "packed", "versions", "rows_hint", "min_rows", "sources")

    def __init__(self, w: torch.Tensor, rows_hint: int, min_rows: int, sources: tuple[torch.Tensor, ...]):
        self.ref, self.rows_hint, self.min_rows, self.sources = weakref.ref(w), rows_hint, min_rows, sources
        self.packed, self.versions = _pack(w, rows_hint), self.current(w)

    def current(self, w: torch.Tensor) -> tuple[int, ...]:
        return (w._version, *(t._version for t in self.sources))


def _pack(w: torch.Tensor, rows_hint: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows_hint)


def check_packable(w: torch.Tensor) -> None:
    """Raises ValueError (naming rollout.prepack_weights) unless ``w`` is a CPU float32 matrix and this
    torch build has oneDNN."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2 or not torch.backends.mkldnn.is_available():
        raise ValueError(
            f"rollout.prepack_weights: packs CPU float32 weights with oneDNN, got {w.dtype} on {w.device} "
            f"(oneDNN available: {torch.backends.mkldnn.is_available()}); set rollout.prepack_weights=false"
        )


def prepack(
    w: torch.Tensor, rows_hint: int = 16, min_rows: int = PACKED_MIN_ROWS, sources: tuple[torch.Tensor, ...] = ()
) -> None:
    """Register the linear weight ``w`` (out, in) for oneDNN's prepacked kernel in :func:`linear`
    (``torch.ops.mkldnn``, as inductor's CPU weight prepacking); ``rows_hint``: the rows (tokens) per
    call the packing is laid out for (any count runs); ``min_rows``: calls with fewer rows take
    ``F.linear``; ``sources``: tensors whose in-place writes also change ``w`` (the parameters a fused
    weight's rows are views of), so a write to one repacks it. The entry goes when ``w`` is freed.

    Raises:
        ValueError: ``w`` is not a CPU float32 matrix, or this torch build has no oneDNN.
    """
    check_packable(w)
    key = id(w)
    if key not in _PACKED:
        weakref.finalize(w, _PACKED.pop, key, None)
    _PACKED[key] = _Packed(w, rows_hint, max(1, int(min_rows)), tuple(sources))


def is_packed(w: torch.Tensor) -> bool:
    """Whether ``w`` has a packed copy registered (:func:`prepack`): a cost curve measured with packed
    weights is keyed apart from an unpacked one (workbench.perf.cost_curve.curve_key)."""
    return id(w) in _PACKED


def packed_min_rows(w: torch.Tensor) -> int | None:
    """The fewest rows per call at which ``w`` runs packed (:func:`prepack`'s ``min_rows``), None if unpacked."""
    e = _PACKED.get(id(w))
    return None if e is None or e.ref() is not w else e.min_rows


def unpack(w: torch.Tensor) -> None:
    """Drop ``w``'s packed copy: :func:`linear` calls ``F.linear`` on it again."""
    _PACKED.pop(id(w), None)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``: x (..., in) -> (..., out); through the packed copy when ``w`` was
    :func:`prepack`-ed and x has at least that weight's ``min_rows`` rows (equal to F.linear up to
    float32 rounding, not bit for bit), else ``F.linear``. Compiled graphs (inductor packs weights
    itself) and calls that autograd records (the packed kernel has no backward) always take ``F.linear``."""
    if torch.compiler.is_compiling() or not _PACKED:
        return F.linear(x, w, b)
    e = _PACKED.get(id(w))
    if e is None or x.numel() < e.min_rows * x.shape[-1] or e.ref() is not w:
        return F.linear(x, w, b)
    if torch.is_grad_enabled() and (
        w.requires_grad or x.requires_grad
    ):  # training (a drafter's online step): no backward there
        return F.linear(x, w, b)
    now = e.current(w)
    if now != e.versions:  # written in place since it was packed (the weight sync): pack again
        e.packed, e.versions = _pack(w, e.rows_hint), now
    return torch.ops.mkldnn._linear_pointwise(x, e.packed, b, "none", [], "")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama computes it: x (..., H) normalised in float32, cast back to x's dtype, times w (H,)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def position_mask(pos: torch.Tensor, tk: int, window: int | None = None) -> torch.Tensor:
    """Causal mask by position: query (b, t) at position pos[b, t] may read key positions <= it,
    and with a sliding ``window`` (tokens) only those > pos - window (the query and the window - 1
    before it: transformers' ``sliding_window_overlay``, Mistral).

    pos (B, T) long -> (B, 1, T, tk) bool (broadcast over heads). Key positions past a row's own
    are never read, so stale entries there (rejected drafts, another row's longer length) are harmless.
    """
    keys = torch.arange(tk, device=pos.device)[None, None, :]  # (1, 1, tk)
    mask = keys <= pos[:, :, None]  # (B, T, tk)
    if window is not None:
        mask = mask & (keys > pos[:, :, None] - window)
    return mask[:, None]


def cache_kv(
    cache_k: torch.Tensor, cache_v: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, tk: int
) -> KVFn:
    """The :data:`KVFn` of attention over one layer of a preallocated cache (B, T_max, Hkv, D):
    writes the new k/v (B, T, Hkv, D) at (``rows``, ``pos``) (both (B, T) long) and attends to the
    first ``tk`` cache positions under ``mask`` (B, 1, T, tk)."""

    def kv(k: torch.Tensor, v: torch.Tensor):
        cache_k.index_put_((rows, pos), k)
        cache_v.index_put_((rows, pos), v)
        return cache_k[:, :tk], cache_v[:, :tk], mask

    return kv


def attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Scaled dot-product attention; ``gqa``: Hkv < H (grouped-query, each key/value head serves H/Hkv query heads).

    q (B, T, H, D), keys/vals (B, Tk, Hkv, D), mask (B or 1, 1, T, Tk) bool -> (B, T, H * D).
    ``gqa`` is passed, not read off ``keys``: under ``torch.compile`` a cache's dims are symbolic,
    and a symbolic bool here would break the graph (the whole forward would silently run eager).
    """
    B, T, H, D = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys.transpose(1, 2),
        vals.transpose(1, 2),
        attn_mask=mask,
        enable_gqa=gqa,
    )  # (B, H, T, D)
    return out.transpose(1, 2).reshape(B, T, H * D)


def project(x: torch.Tensor, w: Weight, sizes: tuple[int, ...], b: Bias = None) -> tuple[torch.Tensor, ...]:
    """x (..., in) through a projection whose output splits into parts of ``sizes``: one matmul of a
    fused weight (sum(sizes), in) (and bias (sum(sizes),)) split afterwards, or one matmul per
    weight of a tuple (and bias of a tuple of the same length)."""
    if isinstance(w, torch.Tensor):
        return linear(x, w, b).split(list(sizes), dim=-1)
    return tuple(linear(x, wi, None if b is None else bi) for wi, bi in zip(w, b if b is not None else w))


def _rows(w: Weight) -> int:
    return w.shape[0] if isinstance(w, torch.Tensor) else sum(wi.shape[0] for wi in w)


def attention(
    x: torch.Tensor,
    w_qkv: Weight,
    w_o: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVFn,
    b_qkv: Bias = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Self-attention of x (B, T, in) -> (B, T, hidden), Llama-family.

    w_qkv: the q/k/v projections ((H + 2 Hkv) D, in) fused, or a tuple (w_q, w_k, w_v); w_o
    (hidden, H D). b_qkv: their biases (Qwen2), fused ((H + 2 Hkv) D,) or a tuple, or None.
    qk_norm: the RMSNorm weights (D,), (D,) applied to each head of q and k BEFORE RoPE
    (Qwen3: ``q_norm``/``k_norm``, epsilon ``eps``), or None. cos/sin (B, T, 1, D) at the queries'
    positions (:func:`rope_cos_sin`); ``kv`` stores the new keys/values and returns what to attend
    to (:data:`KVFn`). The head counts are read off the weights' shapes (so under ``torch.compile``
    they are constants of the graph).
    """
    B, T, _ = x.shape
    D = cos.shape[-1]
    H = w_o.shape[1] // D
    Hkv = (_rows(w_qkv) - H * D) // (2 * D)
    q, k, v = project(x, w_qkv, (H * D, Hkv * D, Hkv * D), b_qkv)  # 3 x (B, T, heads * D)
    q, k, v = q.reshape(B, T, H, D), k.reshape(B, T, Hkv, D), v.reshape(B, T, Hkv, D)
    if qk_norm is not None:
        q, k = rms_norm(q, qk_norm[0], eps), rms_norm(k, qk_norm[1], eps)  # per head (..., D), modeling_qwen3
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    keys, vals, mask = kv(k, v)  # stores k, v (B, T, Hkv, D); returns what the queries attend to
    return linear(attend(q, keys, vals, mask, gqa=H != Hkv), w_o)


def mlp(x: torch.Tensor, w_gate_up: Weight, w_down: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); x (B, T, hidden) -> (B, T, hidden).

    w_gate_up: gate and up (2I, hidden) fused, or a tuple (w_gate, w_up); w_down (hidden, I).
    """
    inter = w_down.shape[1]
    gate, up = project(x, w_gate_up, (inter, inter))  # 2 x (B, T, inter)
    return linear(F.silu(gate) * up, w_down)


def decoder_layer(
    attn_in: torch.Tensor,
    resid: torch.Tensor,
    w_qkv: Weight,
    w_o: torch.Tensor,
    w_post: torch.Tensor,
    w_gate_up: Weight,
    w_down: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVFn,
    b_qkv: Bias = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One pre-norm decoder layer from its attention input: h = resid + attention(attn_in);
    returns h + mlp(rms_norm(h, w_post)) (B, T, hidden). ``b_qkv``, ``qk_norm``: as :func:`attention`.

    A Llama layer passes attn_in = rms_norm(x, input norm), resid = x; a chain drafter's module
    builds both from its feature and token embedding (``drafters.chain``).
    """
    h = resid + attention(attn_in, w_qkv, w_o, cos, sin, kv, b_qkv, qk_norm, eps)
    return h + mlp(rms_norm(h, w_post, eps), w_gate_up, w_down)


class RMSNorm(nn.Module):
    """:func:`rms_norm` with its weight (H,) as a parameter."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """The q/k/v/o projections of one attention layer (Hugging Face names): q/k/v biases when
    ``cfg.qkv_bias`` (Qwen2), per-head ``q_norm``/``k_norm`` (D,) when ``cfg.qk_norm`` (Qwen3).

    ``in_dim``: the input width (the hidden size; EAGLE-3's layer reads 2 x hidden).
    """

    def __init__(self, cfg: Any, in_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        d, in_dim, bias = cfg.head_dim, in_dim or cfg.hidden_size, getattr(cfg, "qkv_bias", False)
        self.q_proj = nn.Linear(in_dim, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(in_dim, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(in_dim, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)
        if getattr(cfg, "qk_norm", False):
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def qkv_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_proj.weight, self.k_proj.weight, self.v_proj.weight

    def qkv_bias(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The q/k/v biases, or None without them."""
        return None if self.q_proj.bias is None else (self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)

    def qk_norm_weight(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The per-head q and k RMSNorm weights (D,), (D,), or None without them."""
        return (self.q_norm.weight, self.k_norm.weight) if hasattr(self, "q_norm") else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVFn) -> torch.Tensor:
        """:func:`attention` with this module's weights: x (B, T, in_dim) -> (B, T, hidden)."""
        return attention(
            x,
            self.qkv_weight(),
            self.o_proj.weight,
            cos,
            sin,
            kv,
            self.qkv_bias(),
            self.qk_norm_weight(),
            self.cfg.rms_norm_eps,
        )


class MLP(nn.Module):
    """The gate/up/down projections of a SwiGLU MLP (Hugging Face names, no biases)."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def gate_up_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_proj.weight, self.up_proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`mlp` with this module's weights: (B, T, hidden) -> (B, T, hidden)."""
        return mlp(x, self.gate_up_weight(), self.down_proj.weight)


class KVCache:
    """Preallocated keys/values of ``num_layers`` attention layers (default ``cfg.num_layers``).

    Per layer ``k[i]``, ``v[i]``: (B, T_max, Hkv, D), rows first so that rows scatter and leave
    easily. Row b's entry at position s is valid once written; entries past a row's verified
    length are stale and never read (:func:`position_mask`), and the next write overwrites them.

    The views live in the first B rows of per-layer buffers (B_alloc >= B, T_max, Hkv, D):
    ``select`` copies the kept rows to the front of the same buffers and narrows the views, so
    retiring finished rows allocates one layer's kept rows at a time (a gather before the write,
    freed at once), never a second whole cache (an ``index_select`` over every
    layer built the new cache before the old one was freed, doubling peak KV memory). The buffers
    are only freed with the cache, so memory stays at the batch's start size until it ends.

    ``capacity``: rows to allocate (>= ``batch``), the most ``select`` may grow the cache to without
    reallocating (a prefill of U distinct prompts expands to the B rows that share them).
    ``base``: per-layer (keys, values) buffers to live in instead of fresh ones
    (:class:`workbench.rollout.graphs.StaticCachePool`); every view is then marked a static
    address, so CUDA graphs that write the cache in place stay valid.
    """

    def __init__(
        self,
        cfg: Any,
        batch: int,
        max_len: int,
        device,
        dtype,
        num_layers: int | None = None,
        base: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
        capacity: int | None = None,
    ):
        n = cfg.num_layers if num_layers is None else num_layers
        self.max_len = max_len
        self.static = base is not None  # pooled buffers: addresses are static inputs of CUDA graphs
        if base is None:
            shape = (max(batch, capacity or batch), max_len, cfg.num_kv_heads, cfg.head_dim)
            base = (
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)],
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)],
            )
        self.base = base
        self.capacity = base[0][0].shape[0] if base[0] else max(batch, capacity or batch)  # rows the buffers hold
        self._views(batch)

    def _views(self, rows: int) -> None:
        self.k = [b[:rows] for b in self.base[0]]  # (rows, T_max, Hkv, D) views: same addresses
        self.v = [b[:rows] for b in self.base[1]]
        if self.static:
            for t in self.k + self.v:
                torch._dynamo.mark_static_address(t)

    def select(self, rows: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        """Keep only ``rows`` (R,) long row indices, in place: row j becomes old row ``rows[j]``
        (finished sequences leave; or, R > B, a prefilled prompt is copied to the rows sharing it).
        ``moved``: (m,) long, the rows j with ``rows[j] != j`` when the caller knows them (the
        engine does, on the host); only those are copied. None: every row is.

        Layer by layer, the kept rows are gathered (one layer's (R, T_max, Hkv, D), freed before
        the next layer) and written to the buffers' first R rows; gathered first, so overlapping
        source and destination rows copy correctly. Growing past ``capacity`` reallocates the
        buffers (not for pooled ones, whose addresses CUDA graphs hold).

        Why ``moved``: a whole cache is large next to a CPU's memory bandwidth (SmolLM2 at batch 64:
        0.5 GB; a whole copy per retirement made 80 % of a generation's time), and the engine
        retires by moving the tail's live rows into the holes
        (:func:`workbench.rollout.engine.compact_order`), so a retirement copies as many rows as left.
        """
        n = rows.shape[0]
        if n > self.capacity:
            if self.static:
                raise ValueError(
                    f"KVCache.select: {n} rows exceed the pooled buffers' {self.capacity} (lease with capacity=)"
                )
            self.base = ([t.index_select(0, rows) for t in self.k], [t.index_select(0, rows) for t in self.v])
            self.capacity = n
        elif moved is not None:
            if moved.numel():
                src = rows.index_select(0, moved)  # (m,) their source rows
                for views, bufs in ((self.k, self.base[0]), (self.v, self.base[1])):
                    for t, b in zip(views, bufs):
                        b.index_copy_(0, moved, t.index_select(0, src))
        else:
            for views, bufs in ((self.k, self.base[0]), (self.v, self.base[1])):
                for t, b in zip(views, bufs):
                    b[:n] = t.index_select(0, rows)
        self._views(n)

    def append(self, other: "KVCache") -> None:
        """Add ``other``'s rows after this cache's rows (continuous batching: prompts admitted into
        the slots finished rows left), in place while ``capacity`` holds them; both caches have the
        same layers and ``max_len``."""
        n, m = self.k[0].shape[0] if self.k else 0, other.k[0].shape[0] if other.k else 0
        if n + m > self.capacity:
            if self.static:
                raise ValueError(f"KVCache.append: {n + m} rows exceed the pooled buffers' {self.capacity}")
            self.base = (
                [torch.cat([a, b]) for a, b in zip(self.k, other.k)],
                [torch.cat([a, b]) for a, b in zip(self.v, other.v)],
            )
            self.capacity = n + m
        else:
            for bufs, src in ((self.base[0], other.k), (self.base[1], other.v)):
                for b, t in zip(bufs, src):
                    b[n : n + m] = t
        self._views(n + m)

    def kv_fn(self, layer: int, pos: torch.Tensor, tk: int | None = None) -> KVFn:
        """:func:`cache_kv` of ``layer`` for queries at positions ``pos`` (B, T) long, attending to
        the first ``tk`` positions (default: the largest position + 1, one host read)."""
        B, T = pos.shape
        tk = int(pos.max()) + 1 if tk is None else tk
        rows = torch.arange(B, device=pos.device)[:, None].expand(B, T)
        return cache_kv(self.k[layer], self.v[layer], rows, pos, position_mask(pos, tk), tk)
