"""How noisy is a ratio of two generation timings on this machine? (issue #6)

Two plain-decoding (autoregressive) generations of the same 64 quickstart prompts, with
different seeds, timed (a) back to back and (b) interleaved forward by forward
(workbench.rollout.paired.generate_interleaved). Both arms do the same work, so every deviation of
their ratio from 1 is measurement noise. Prints per-pair ratios and the sd of the log-ratios.

    python benchmarks/paired_noise.py [pairs]
"""

import math
import statistics
import sys
import time

import torch

from workbench.grpo.trainer import GRPOTrainer
from workbench.models.tokenizer import encode_prompt
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.paired import generate_interleaved
from workbench.run_build import build_parts
from workbench.specs import load_spec

pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 14
tr = GRPOTrainer(build_parts(load_spec("quickstart", ["drafter.kind=none", "measure.modeled=false"]), progress=False))
engine = RolloutEngine(tr.backend.target, None, max_batch_size=256)
g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
logs = {"back to back": [], "interleaved": []}
for i in range(pairs + 1):  # pair 0 is warm-up
    prompts = [encode_prompt(tr.tokenizer, r["prompt"]) for r in tr._next_prompts() for _ in range(8)]
    t0 = time.perf_counter()
    engine.generate(prompts, tr.sampling, g1)
    t1 = time.perf_counter()
    engine.generate(prompts, tr.sampling, g2)
    t2 = time.perf_counter()
    _, (a, b) = generate_interleaved(
        [engine.generate_steps(prompts, tr.sampling, g1), engine.generate_steps(prompts, tr.sampling, g2)],
        time.perf_counter,
        first=i % 2,
    )
    r_seq, r_int = (t1 - t0) / (t2 - t1), a / b
    print(f"pair {i:2d}: back to back {r_seq:.3f}   interleaved {r_int:.3f}")
    if i:
        logs["back to back"].append(math.log(r_seq))
        logs["interleaved"].append(math.log(r_int))
for k, v in logs.items():
    print(
        f"{k:>12}: ratios {math.exp(min(v)):.2f}-{math.exp(max(v)):.2f}, log-ratio sd {statistics.stdev(v):.3f} over "
        f"{len(v)} pairs"
    )
