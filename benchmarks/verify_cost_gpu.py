"""GPU cost curve of a Qwen3-8B-shaped forward's matmuls and of an EAGLE-3 head (#33): is verification
compute-bound at B · (k + 1) tokens, and at what fraction of peak?

    python benchmarks/verify_cost_gpu.py --out verify-cost.json      # on a CUDA machine (bf16)

Times, with CUDA events, the weight matmuls of one forward over T tokens (T = rows · (k + 1)):
Qwen3-8B's 36 layers (q, k, v, o; gate, up, down) + its 151,936-id lm_head, and an EAGLE-3 head (one
layer of the same width, the fused 3H -> H fc, a 32,000-id draft lm_head), random bf16 weights, for
rows in ROWS and k in KS; the median of REPS after WARMUP. Attention over the KV cache is not in it
(a memory-bound read, priced by the simulator from bytes). Reports ms, achieved TFLOP/s and the
fraction of the device's dense bf16 peak (--peak-tflops, default H100 SXM 989), and per rows the
ratio t(rows · (k + 1)) / t(rows): what one verification costs in decode steps of the same rows.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

H, INTER, V, LAYERS, HEADS, KV, HD, DRAFT_V = 4096, 12288, 151936, 36, 32, 8, 128, 32000
ROWS = (1, 16, 64, 128, 256)
KS = (0, 1, 3, 5, 7)


def layer_shapes() -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's matmuls."""
    return [(H, HEADS * HD), (H, KV * HD), (H, KV * HD), (HEADS * HD, H), (H, INTER), (H, INTER), (INTER, H)]


def build(dev: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Target weights (one layer's set reused 36 times would hide HBM traffic, so 36 distinct sets) and the head's."""
    g = torch.Generator(device=dev).manual_seed(0)
    w = lambda i, o: torch.randn(i, o, device=dev, dtype=torch.bfloat16, generator=g) * 0.02  # noqa: E731
    target = [w(i, o) for _ in range(LAYERS) for i, o in layer_shapes()] + [w(H, V)]
    head = [w(3 * H, H)] + [w(i, o) for i, o in layer_shapes()] + [w(H, DRAFT_V)]
    return target, head


def run(ws: list[torch.Tensor], x: torch.Tensor) -> None:
    for w in ws:
        y = x[:, : w.shape[0]] if x.shape[1] >= w.shape[0] else x.repeat(1, w.shape[0] // x.shape[1])
        torch.matmul(y, w)


def time_ms(ws: list[torch.Tensor], tokens: int, dev: str, warmup: int, reps: int) -> float:
    x = torch.randn(tokens, 3 * INTER, device=dev, dtype=torch.bfloat16)
    for _ in range(warmup):
        run(ws, x)
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(ws, x)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="verify-cost.json")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the device (H100 SXM: 989)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = "cuda"
    target, head = build(dev)
    params = {"target": sum(w.numel() for w in target), "head": sum(w.numel() for w in head)}
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "peak_tflops": a.peak_tflops,
        "params": params,
        "rows": {},
    }
    for rows in ROWS:
        per = {}
        for k in KS:
            t = rows * (k + 1)
            cell = {}
            for name, ws in (("target", target), ("head", head)):
                ms = time_ms(ws, t, dev, a.warmup, a.reps)
                tflops = 2 * params[name] * t / (ms * 1e-3) / 1e12
                cell[name] = {"tokens": t, "ms": ms, "tflops": tflops, "peak_fraction": tflops / a.peak_tflops}
            per[str(k)] = cell
            print(
                f"rows {rows:4d} k {k}: target {cell['target']['ms']:.3f} ms ({cell['target']['peak_fraction']:.2f} "
                f"of peak), head {cell['head']['ms']:.3f} ms",
                flush=True,
            )
        for k in KS:
            per[str(k)]["target"]["ratio_to_decode"] = per[str(k)]["target"]["ms"] / per["0"]["target"]["ms"]
        res["rows"][str(rows)] = per
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
