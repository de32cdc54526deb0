"""A/B of one linear layer at a model's decode shapes: ``F.linear`` (what our engine calls: MKL sgemm
on the weight as stored) vs MKL's prepacked sgemm (``torch.ops.mkl._mkl_linear`` over
``torch.ops.mkl._mkl_reorder_linear_weight``: what inductor's CPU freezing emits for float32
linears; vLLM-CPU prepacks its weights for oneDNN the same way, ``create_onednn_mm``). Interleaved
rounds in one process, median µs per call; outputs compared (max |diff|).
``--kernel onednn``: oneDNN's packed kernel instead (``torch.ops.mkldnn._linear_pointwise`` over
``_reorder_linear_weight``: what the workbench engine runs with ``rollout.prepack_weights``), the weight
packed for ``--rows-hint`` rows (0: for each row count itself), to choose ``rollout.prepack_min_rows``.

    python benchmarks/ab_prepack.py --shapes 1536x512,512x512,512x1536,512x1024 --rows 1,4,16
    python benchmarks/ab_prepack.py --kernel onednn --rows-hint 16 --shapes 960x576,576x576,3072x576,576x1536 --rows 1,2,4,8,16
"""  # noqa: E501 (a command line)

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1536x512,512x512,512x1536,512x1024", help="OUTxIN of the weights")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--kernel", choices=("mkl", "onednn"), default="mkl")
    ap.add_argument(
        "--rows-hint", type=int, default=16, help="onednn: rows the weight is packed for (0: each row count)"
    )
    a = ap.parse_args()
    name = "MKL packed" if a.kernel == "mkl" else f"oneDNN packed (hint {a.rows_hint or 'rows'})"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"| weight (out x in) | rows | F.linear µs | {name} µs | F.linear / packed | max abs diff |")
    print("|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        n_out, n_in = (int(x) for x in shape.split("x"))
        w = torch.randn(n_out, n_in)
        for m in (int(x) for x in a.rows.split(",")):
            x = torch.randn(m, n_in)
            if a.kernel == "mkl":
                packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
                fns = {
                    "plain": lambda: F.linear(x, w),
                    "packed": lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, m),
                }
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(w, a.rows_hint or m)
                fns = {
                    "plain": lambda: F.linear(x, w),
                    "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                }
            diff = (fns["plain"]() - fns["packed"]()).abs().max().item()
            reps = max(20, int(2e-2 / max(per_call(fns["plain"], 5), 1e-7)))
            t = {k: [] for k in fns}
            for r in range(a.rounds):
                for k in ("plain", "packed") if r % 2 == 0 else ("packed", "plain"):
                    t[k].append(per_call(fns[k], reps))
            p, q = statistics.median(t["plain"]), statistics.median(t["packed"])
            print(f"| {n_out}x{n_in} | {m} | {1e6 * p:.1f} | {1e6 * q:.1f} | {p / q:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
