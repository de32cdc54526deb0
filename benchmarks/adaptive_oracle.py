"""What could any batch-size rule for k reach on this machine? (issue #8, adaptive speculation)

Fixed threshold policies (speculate k_t = k while the live batch has <= th rows, else decode
plainly; th = 0: never speculate) against plain decoding of the same prompts, paired forward by
forward (workbench.rollout.paired.generate_interleaved) with the drafter a `wb run` of the spec
builds. The best threshold is an upper reference for an adaptive policy that chooses by batch
size; th = 0 measures what merely having a drafter attached costs (its bookkeeping of plain
steps). Prints each policy's paired gen speedup, geometric mean [95 % CI] over the steps after the
first.

    python benchmarks/adaptive_oracle.py SPEC DRAFTER STEPS TH:K,TH:K,...
    python benchmarks/adaptive_oracle.py longtail draft_model 9 0:1,2:2,4:2,8:2,16:2,4:3,8:3,16:3,64:2
"""

import sys
import time

import torch

from workbench.grpo.trainer import GRPOTrainer
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.paired import generate_interleaved
from workbench.run_build import build_parts
from workbench.specs import load_spec
from workbench.stats import ratio_ci


class Threshold:
    """k_t = k while the batch has at most ``th`` live rows, else 0."""

    def __init__(self, th: int, k: int):
        self.th, self.k = th, k

    def choose(self, num_rows: int) -> int:
        return self.k if num_rows <= self.th else 0

    def update(self, *args) -> None:
        pass


def main(spec_name: str, kind: str, steps: int, combos: list[tuple[int, int]]) -> None:
    k_max = max(k for _, k in combos)
    tr = GRPOTrainer(
        build_parts(
            load_spec(spec_name, [f"drafter.kind={kind}", f"drafter.k={k_max}", "tracking.enabled=false"]),
            progress=False,
        )
    )
    plain = RolloutEngine(tr.backend.target, None, max_batch_size=tr.parts.rollout.engine.max_batch_size)
    ratios: dict[tuple[int, int], list[float]] = {c: [] for c in combos}
    for step in range(steps + 1):  # step 0 is warm-up
        _, prompts, group_ids = tr._step_prompts()
        for c in combos:
            eng = RolloutEngine(
                tr.backend.target,
                tr.drafter,
                k=k_max,
                max_batch_size=tr.parts.rollout.engine.max_batch_size,
                k_policy=Threshold(*c),
            )
            g_spec, g_plain = (torch.Generator().manual_seed(step) for _ in range(2))
            _, (spec_s, plain_s) = generate_interleaved(
                [
                    eng.generate_steps(prompts, tr.sampling, g_spec, group_ids),
                    plain.generate_steps(prompts, tr.sampling, g_plain, group_ids),
                ],
                time.perf_counter,
                first=step % 2,
            )
            if step:
                ratios[c].append(plain_s / spec_s)
    for (th, k), r in ratios.items():
        ci = ratio_ci(r)
        print(f"{spec_name} {kind} th={th} k={k}: {ci.mean:.3f}x [{ci.low:.3f}, {ci.high:.3f}] (n={len(r)})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), [tuple(map(int, c.split(":"))) for c in sys.argv[4].split(",")])
