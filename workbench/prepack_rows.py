"""Where oneDNN's packed GEMM starts to beat ``F.linear``, measured once per weight shape and machine.

The rollout engine runs a packed weight (``rollout.prepack_weights``, :func:`workbench.rollout.packing.prepack`)
through ``F.linear`` below a number of rows (tokens) per call. That crossing depends on the shape: on the
2-core CPU VM SmolLM2's fused q/k/v (960 x 576) ran 1.6-2.2x faster packed from 4 rows, its down
projection (576 x 1536) 0.7-0.8x *slower* packed at 4-8 rows and 1.9x faster at 16
(benchmarks/ab-prepack-onednn-smollm2-cpu.md): MKL's unpacked kernel changes algorithm with the row count,
so one threshold for every weight loses on some of them. So each shape is timed both ways at
:data:`CANDIDATE_ROWS` (interleaved rounds, medians; random values: the speed does not depend on them) and
the smallest row count from which the packed kernel wins at every larger candidate is kept.

Cache: ``<cache_dir>/prepack_rows.json``, one entry per (shape, rows hint, dtype, torch version, threads,
CPU model), with the medians and the load average when measured (a loaded machine measures noise: delete
the file to measure again). Cached choices make the kernel per call, and so the float rounding, the same
from run to run on one machine.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from workbench.cache import cache_dir, short_hash
from workbench.files import write_text
from workbench.timing import device_name

CANDIDATE_ROWS = (1, 2, 4, 8, 16)
VERSION = 1


def choose_min_rows(plain_s: dict[int, float], packed_s: dict[int, float]) -> int:
    """The smallest candidate row count m such that the packed kernel was faster at m and at every
    larger candidate; twice the largest candidate when it lost at the largest.

    Args:
        plain_s, packed_s: {rows: seconds per call} over the same row counts.
    Raises:
        ValueError: no row counts, or the two dicts cover different ones.
    """
    if not plain_s or set(plain_s) != set(packed_s):
        raise ValueError(
            f"choose_min_rows: need timings at the same row counts, got {sorted(plain_s)} and {sorted(packed_s)}"
        )
    rows = sorted(plain_s)
    best = 2 * rows[-1]
    for m in reversed(rows):
        if packed_s[m] < plain_s[m]:
            best = m
        else:
            break
    return best


def _per_call(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def time_kernels(
    out_features: int,
    in_features: int,
    rows_hint: int,
    rows: tuple[int, ...] = CANDIDATE_ROWS,
    rounds: int = 7,
    round_s: float = 2e-3,
    seed: int = 0,
) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds per call of ``F.linear`` and of the packed kernel (laid out for ``rows_hint`` rows)
    for a random float32 (out, in) weight and (m, in) inputs, m in ``rows``; the two alternate within
    each of ``rounds`` rounds of about ``round_s`` seconds each."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)
    plain_s, packed_s = {}, {}
    for m in rows:
        x = torch.randn(m, in_features, generator=g)
        fns = {
            "plain": lambda: F.linear(x, w),
            "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        }
        for f in fns.values():  # warm up (first-call allocations, oneDNN's primitive cache)
            f()
        reps = max(1, int(round_s / max(_per_call(fns["plain"], 3), 1e-7)))
        t: dict[str, list[float]] = {"plain": [], "packed": []}
        for r in range(rounds):
            for k in ("plain", "packed") if r % 2 == 0 else ("packed", "plain"):
                t[k].append(_per_call(fns[k], reps))
        plain_s[m], packed_s[m] = statistics.median(t["plain"]), statistics.median(t["packed"])
    return plain_s, packed_s


def _path():
    return cache_dir() / "prepack_rows.json"


def _read() -> dict:
    try:
        return json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}


def measured_min_rows(out_features: int, in_features: int, rows_hint: int) -> int:
    """:func:`choose_min_rows` for a float32 (out, in) weight packed for ``rows_hint`` rows on this
    machine: read from the cache, else measured (:func:`time_kernels`, well under a second for a
    transformer layer's shapes) and cached."""
    fields = {
        "version": VERSION,
        "shape": [out_features, in_features],
        "rows_hint": rows_hint,
        "dtype": "float32",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": device_name(torch.device("cpu")),
    }
    key = short_hash(fields, 12)
    hit = _read().get(key)
    try:
        return int(hit["min_rows"])
    except (TypeError, KeyError, ValueError):  # no entry, or a damaged one: measure (again)
        pass
    plain_s, packed_s = time_kernels(out_features, in_features, rows_hint)
    entry = {
        **fields,
        "min_rows": choose_min_rows(plain_s, packed_s),
        "plain_us": {m: round(1e6 * s, 2) for m, s in plain_s.items()},
        "packed_us": {m: round(1e6 * s, 2) for m, s in packed_s.items()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    data = _read()  # re-read: another process may have added entries meanwhile
    data[key] = entry
    p = _path()
    try:  # atomic: a reader never sees half a file
        write_text(p, json.dumps(data, indent=1), sealed=False)
    except OSError:  # a read-only cache: measured again next time
        pass
    return entry["min_rows"]
