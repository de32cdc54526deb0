"""The autoregressive table of `wb bench --compile` (ours vs transformers generate(), batch 1/8/64,
median of 9 interleaved runs each) three times in one process: how stable the ratios are on this machine.
Run: python benchmarks/ar_repeats.py
"""

from workbench.bench import Bench, BenchConfig
from workbench.cli import _load

b = Bench(_load(None, []), BenchConfig(batch_sizes=(1, 8, 64), repeats=9, compile=True))
for i in range(3):
    rows = b.run_ar()
    print(
        "run",
        i,
        " ".join(
            f"B={r['batch']}: {r['ratio_generate']:.2f} ({r['ours_tok_s']:.0f} vs {r['hf_generate_tok_s']:.0f} tok/s)"
            for r in rows
        ),
        flush=True,
    )
