"""Prepacked linear weights (``rollout.prepack_weights``): oneDNN's packed GEMM for CPU float32 rows.

:func:`prepack` registers a weight, :func:`linear` is ``F.linear`` that runs a registered weight's
packed copy when a call has enough rows (``min_rows``, measured per weight shape by
:mod:`workbench.prepack_rows`), and packs it again after any in-place write (the weight sync, an
optimiser step). The packing is what inductor's CPU weight prepacking and vLLM-CPU do at load;
``torch.ops.mkldnn`` runs it. Shapes: x (..., in), w (out, in).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

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
