"""The rollout's KV cache: preallocated per-layer keys and values that rows can leave and join.

Shapes: B rows, T_max positions, Hkv key/value heads, D head dim (:mod:`workbench.rollout.layers`).
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.rollout.layers import KVFn, cache_kv, position_mask


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
        (:func:`workbench.rollout.batch.compact_order`), so a retirement copies as many rows as left.
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
