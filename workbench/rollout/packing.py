"""Prepacked linear weights (``rollout.prepack_weights``): oneDNN's packed GEMM for CPU float32 rows.

:func:`prepack` registers a weight, :func:`linear` is ``F.linear`` that runs a registered weight's
packed copy when a call has enough rows (``min_rows``, measured per weight shape by
:mod:`workbench.prepack_rows`), and packs it again after any in-place write (the weight sync, an
optimiser step). The packing is what inductor's CPU weight prepacking and vLLM-CPU do at load;
``torch.ops.mkldnn`` runs it. Inside a compiled graph (``rollout.compile`` with packed weights) the
packed call is one opaque op, ``workbench::packed_linear``, so inductor fuses the glue around it
(norms, rotary, SwiGLU, residuals) into C++ kernels and the GEMMs stay packed: inductor packs weights
itself only when it freezes them, and the policy's weights change every GRPO step.
Shapes: x (..., in), w (out, in).
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
# The same entries by (storage address, shape): a compiled graph may hand its custom op another tensor object
# over the registered weight's storage (an alias made by the graph's wrappers), so ids alone could miss.
_BY_PTR: dict[tuple[int, tuple[int, ...]], "_Packed"] = {}
# Whether any weight was ever packed: compiled graphs traced after that route linear through packed_linear (a
# bool read at trace time, so TorchDynamo guards on it; graphs traced before it take F.linear, as before).
_ANY = False
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
    global _ANY
    check_packable(w)
    key, pkey = id(w), (w.data_ptr(), tuple(w.shape))
    if key not in _PACKED:
        weakref.finalize(w, _PACKED.pop, key, None)
        weakref.finalize(w, _BY_PTR.pop, pkey, None)
    _PACKED[key] = _BY_PTR[pkey] = _Packed(w, rows_hint, max(1, int(min_rows)), tuple(sources))
    _ANY = True


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
    e = _PACKED.pop(id(w), None)
    if e is not None and _BY_PTR.get((w.data_ptr(), tuple(w.shape))) is e:
        del _BY_PTR[(w.data_ptr(), tuple(w.shape))]


def _entry(w: torch.Tensor) -> "_Packed | None":
    """``w``'s live entry: by id, else (a compiled graph's alias of it) by storage address and shape."""
    e = _PACKED.get(id(w))
    if e is not None and e.ref() is w:
        return e
    e = _BY_PTR.get((w.data_ptr(), tuple(w.shape)))
    v = None if e is None else e.ref()
    return e if v is not None and v.data_ptr() == w.data_ptr() and v.stride() == w.stride() else None


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``: x (..., in) -> (..., out); through the packed copy when ``w`` was
    :func:`prepack`-ed and x has at least that weight's ``min_rows`` rows (equal to F.linear up to
    float32 rounding, not bit for bit), else ``F.linear``. Calls that autograd records (the packed
    kernel has no backward) always take ``F.linear``. In a compiled graph traced after a weight was
    packed the call is :func:`packed_linear`, an opaque op that makes the same choice when it runs."""
    if not _ANY or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
        return F.linear(x, w, b)  # nothing packed, or training (a drafter's online step): no backward there
    if torch.compiler.is_compiling():  # the op has a CPU kernel only (packed weights are CPU float32)
        return packed_linear(x, w, b) if x.device.type == "cpu" else F.linear(x, w, b)
    return _run(x, w, b)


def _run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    e = _entry(w) if _PACKED else None
    if e is None or x.numel() < e.min_rows * x.shape[-1]:
        return F.linear(x, w, b)
    ref = e.ref()
    now = e.current(ref)
    if now != e.versions:  # written in place since it was packed (the weight sync): pack again
        e.packed, e.versions = _pack(ref, e.rows_hint), now
    return torch.ops.mkldnn._linear_pointwise(x, e.packed, b, "none", [], "")


# workbench::packed_linear: declared with torch.library.Library, its CPU kernel the Python _run, rather than with
# torch.library.custom_op, whose per-call wrappers (autograd, dynamo-disable, redispatch) cost more host time per
# call than inductor's fusion saved in the first A/B (121 calls a SmolLM2 forward). No autograd kernel: linear()
# never routes a call autograd records here.
_LIB = torch.library.Library("workbench", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor w, Tensor? b=None) -> Tensor")
_LIB.impl("packed_linear", _run, "CPU")


@torch.library.register_fake("workbench::packed_linear", lib=_LIB)
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` as one op of a compiled graph (``torch.ops.workbench.packed_linear``): x (..., in),
    w (out, in) -> (..., out); the packed kernel or ``F.linear``, chosen when the graph runs (the weight's
    entry, the call's rows)."""
    return torch.ops.workbench.packed_linear(x, w, b)
