"""CUDA graphs for the decode and verification steps (``rollout.cuda_graphs``).

A CUDA graph replays a recorded kernel sequence with one launch, so a small model's step is no
longer bound by the host launching ~100 kernels (vLLM captures its decode step the same way). We
let ``torch.compile(mode="reduce-overhead")`` (cudagraph trees) record them and keep the number
of distinct shapes small, as vLLM does with its capture sizes:

- the batch shrinks only to capture sizes (powers of two up to ``max_batch_size``), finished rows
  riding along until the live ones fit the next size (``RolloutEngine(retire_buckets=)``);
- the KV cache lives in buffers leased from a pool that outlives a generation, at a length rounded
  up to :data:`CACHE_LEN_MULTIPLE`, and is compacted in place (``KVCache(base=)``), so its
  addresses are static inputs of the graphs (a graph writes the cache in place; torch records
  graphs with mutated inputs only for static ones);
- attention spans a multiple of :data:`GRAPH_ATTENTION_MULTIPLE` cache positions (masked beyond
  each row), not of 32 as in plain compiled mode.

Not run on a GPU in this repository's CI (no device): ``benchmarks/gpu.sh`` sets
``TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1`` for its cuda-graphs rows so a graph torch would skip fails
loudly there, and runs log ``engine/cudagraph_skips`` (torch's own counter).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from workbench.rollout.kv_cache import KVCache

CACHE_LEN_MULTIPLE = 64  # KV-cache length granularity (tokens): few distinct graph shapes across batches
GRAPH_ATTENTION_MULTIPLE = 128  # attended cache positions granularity under CUDA graphs (tokens)


def capture_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes graphs are recorded for: 1, 2, 4, ... below ``max_batch_size``, and it."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_batch_size])


def round_cache_len(t_max: int, max_positions: int) -> int:
    """``t_max`` rounded up to :data:`CACHE_LEN_MULTIPLE`, unless that passes the model's positions."""
    r = -(-t_max // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE
    return r if r <= max_positions else t_max


def cudagraph_skips() -> int:
    """Graphs torch declined to record so far in this process (its ``cudagraph_skips`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


class StaticCachePool:
    """KV-cache buffers reused across generations: a lease returns a :class:`KVCache` living in a
    buffer no live cache holds (an engine's and its paired baseline's caches never share one);
    a buffer is free again once its cache is garbage."""

    def __init__(self) -> None:
        self._bufs: list[tuple[tuple, Any, weakref.WeakSet]] = []  # (key, (keys, values), live caches)

    def lease(
        self,
        cfg: Any,
        batch: int,
        max_len: int,
        device,
        dtype,
        capacity: int | None = None,
        num_layers: int | None = None,
    ) -> KVCache:
        """A cache of ``batch`` rows in a buffer of at least ``capacity`` (>= batch) rows, the most
        its ``select`` may grow it to (a prefill of distinct prompts expands to the whole batch)."""
        n = cfg.num_layers if num_layers is None else num_layers
        capacity = max(batch, capacity or batch)
        key = (max_len, n, cfg.num_kv_heads, cfg.head_dim, str(device), dtype)
        for k, base, users in self._bufs:
            if k == key and not len(users) and base[0][0].shape[0] >= capacity:
                break
        else:
            shape = (capacity, max_len, cfg.num_kv_heads, cfg.head_dim)
            base = (
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)],
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)],
            )
            users = weakref.WeakSet()
            self._bufs.append((key, base, users))
        cache = KVCache(cfg, batch, max_len, device, dtype, num_layers=n, base=base)
        users.add(cache)
        return cache
