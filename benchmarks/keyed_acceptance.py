"""Draft acceptance under the three ways a model drafter's drafts can be verified: today's rejection sampling
with drafts sampled from q (Leviathan et al.), keyed sampling with argmax drafts (vLLM's proposers), keyed
sampling with the coupled draft (Daliri et al.: q's Gumbel-max sample under the target's keyed noise).
Acceptance is counted, not timed, so this may run beside other work.

    python benchmarks/keyed_acceptance.py SPEC OUT.json [--rows N] [--k K] [--kinds draft_model,eagle3]
    python benchmarks/keyed_acceptance.py quickstart benchmarks/keyed_acceptance_tiny.json

For each model drafter kind the spec's target supports (draft_model, mtp, eagle3, dflash; each built as
``wb run`` builds it, its init cached), at temperature 1.0 and 0.7: the same task prompts (``--rows`` rows,
GRPO groups of the spec's group size), the same k, each mode once; prints acceptance length (tokens per
verification step) and per-position acceptance rates with binomial 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import time

MODES = (("rejection", "coupled"), ("keyed", "argmax"), ("keyed", "coupled"))
KINDS = ("draft_model", "mtp", "eagle3", "dflash")


def wilson(x: int, n: int) -> tuple[float, float]:
    """The Wilson 95 % interval of a binomial proportion x / n."""
    if n == 0:
        return (float("nan"), float("nan"))
    z, p = 1.96, x / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (c - h, c + h)


def main() -> None:
    import torch

    from workbench.audit.setup import audit_setup
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs import load_spec
    from workbench.timing import host_description

    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated model drafter kinds (default: all four)")
    a = ap.parse_args()
    spec = load_spec(a.spec, [f"drafter.k={a.k}"])
    dev = torch.device("cpu")
    setup = audit_setup(spec, a.kinds.split(","), max(8, a.rows // spec.grpo.group_size), dev)
    g = spec.grpo.group_size
    prompts = [p for p in setup.prompt_ids for _ in range(g)][: a.rows]
    groups = [i // g for i in range(len(prompts))]
    out = {"spec": a.spec, "k": a.k, "rows": len(prompts), "machine": host_description(dev), "results": [],
           "skipped": setup.skipped, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    for kind, drafter in setup.drafters.items():
        for temp in (1.0, 0.7):
            for sampler, draft in MODES:
                sp = SamplingParams(temp, 1.0, 0, spec.rollout.max_new_tokens, setup.tokenizer.eos_token_id,
                                    setup.stop_token_ids, sampler=sampler, keyed_draft=draft)  # fmt: skip
                eng = RolloutEngine(setup.lm, drafter, k=a.k)
                c = eng.generate(prompts, sp, torch.Generator().manual_seed(0), group_ids=groups).counters
                per = [int(x) for x in c.num_accepted_tokens_per_pos]
                row = {
                    "kind": kind, "temperature": temp, "mode": f"{sampler}/{draft}" if sampler == "keyed" else
                    "rejection/sampled", "drafts": c.num_drafts,
                    "acceptance_length": 1 + c.num_accepted_tokens / max(1, c.num_drafts),
                    "acceptance_rate_per_pos": [x / max(1, c.num_drafts) for x in per],
                    "first_pos_ci95": wilson(per[0] if per else 0, c.num_drafts),
                }  # fmt: skip
                out["results"].append(row)
                print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
