"""Where a verification's time goes against a decode step's: one target forward of ``rows`` x 1 token
(a decode step) and of ``rows`` x (k + 1) tokens (a k = 3 verification), profiled op by op.

    python benchmarks/profile_verify.py                                   # SmolLM2, 4 rows, packed weights
    python benchmarks/profile_verify.py --rows 1,4 --no-prepack --out benchmarks/profile-verify-smollm2-unpacked-cpu

The engine's own LeanLM (eager, float32) over a KV cache holding --ctx tokens, with packed weights as `wb`
runs them by default on a CPU (:meth:`LeanLM.enable_prepack`, each shape's threshold from
:func:`workbench.prepack_rows.measured_min_rows`) unless --no-prepack. Per forward shape: wall ms (median
of --repeats, no profiler), then torch.profiler's self CPU ms per forward by op, and the GEMM calls by input
shape (which kernel each shape took: ``mkldnn::_linear_pointwise`` packed, ``aten::mm``/``aten::addmm``
unpacked). Sampling and rejection are in neither: only the forward, which is what the cost curve prices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from workbench.models import load_model, resolve_model
from workbench.rollout.model import LeanLM

GEMM_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear")


def forward_fn(lm: LeanLM, rows: int, t: int, ctx: int):
    """A closure running one forward of (rows, t) new tokens over a cache already holding ctx tokens."""
    g = torch.Generator().manual_seed(0)
    cache = lm.new_cache(rows, ctx + t + 1)
    x = torch.randint(3, lm.cfg.vocab_size, (rows, t), generator=g)  # (rows, t)
    start = torch.full((rows,), ctx)
    return lambda: lm(x, start, cache, max_start=ctx)


@torch.no_grad()
def profile_shape(fn, repeats: int) -> dict:
    """{wall_ms, ops: {name: (self ms per forward, calls per forward)}, gemm: {name @ shapes: (ms, calls)}}."""
    for _ in range(3):
        fn()  # warm-up: oneDNN primitive caches, allocator
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(repeats):
            fn()
    ops, gemm = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])
    for e in prof.key_averages(group_by_input_shape=True):
        ms = e.self_cpu_time_total / 1e3 / repeats
        ops[e.key][0] += ms
        ops[e.key][1] += e.count / repeats
        if e.key in GEMM_OPS:
            shapes = "x".join(str(tuple(s)) for s in e.input_shapes[:2] if s)
            gemm[f"{e.key} {shapes}"][0] += ms
            gemm[f"{e.key} {shapes}"][1] += e.count / repeats
    return {"wall_ms": 1e3 * statistics.median(walls), "ops": dict(ops), "gemm": dict(gemm)}


def table(cells: dict[str, dict], key: str, top: int) -> list[str]:
    """A Markdown table: the ``top`` entries of ``key`` by the largest cell's ms, one column pair per cell."""
    names = list(cells)
    order = sorted(
        {n for c in cells.values() for n in c[key]}, key=lambda n: -max(c[key].get(n, [0])[0] for c in cells.values())
    )
    lines = ["| " + key + " | " + " | ".join(f"{n} ms | {n} calls" for n in names) + " |"]
    lines.append("|---|" + "---|---|" * len(names))
    for n in order[:top]:
        cols = [f"{cells[c][key].get(n, [0, 0])[0]:.2f} | {cells[c][key].get(n, [0, 0])[1]:.0f}" for c in names]
        lines.append(f"| `{n}` | " + " | ".join(cols) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--rows", default="4")
    ap.add_argument("--k", type=int, default=3, help="the verification forward's width is k + 1 tokens")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--no-prepack", action="store_true", help="unpacked weights (rollout.prepack_weights=false)")
    ap.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    a = ap.parse_args()
    lm = LeanLM.from_hf(load_model(resolve_model(a.target))[0])
    if not a.no_prepack:
        from workbench.prepack_rows import measured_min_rows

        lm.enable_prepack(64 * (a.k + 1), measured_min_rows)
    cells = {}
    for r in map(int, a.rows.split(",")):
        for t in (1, a.k + 1):
            cells[f"{r}x{t}"] = profile_shape(forward_fn(lm, r, t, a.ctx), a.repeats)
    lines = [
        f"# One forward of `{a.target}`: decode step vs k = {a.k} verification "
        f"({'unpacked' if a.no_prepack else 'packed'} weights)",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, ctx {a.ctx}, {a.repeats} forwards per cell; "
        "cells are rows x tokens per row.",
        "",
        "| cell | wall ms (median) | profiled self CPU ms | op calls |",
        "|---|---|---|---|",
    ]
    for n, c in cells.items():
        tot = sum(v[0] for v in c["ops"].values())
        calls = sum(v[1] for v in c["ops"].values())
        lines.append(f"| {n} | {c['wall_ms']:.2f} | {tot:.2f} | {calls:.0f} |")
    lines += ["", "## Ops, self CPU ms and calls per forward", ""] + table(cells, "ops", a.top)
    lines += ["", "## GEMMs by input shape", ""] + table(cells, "gemm", 2 * a.top)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(f"{a.out}.md", "w") as f:
            f.write(text)
        with open(f"{a.out}.json", "w") as f:
            json.dump({"args": vars(a), "cells": cells}, f, indent=1)


if __name__ == "__main__":
    main()
