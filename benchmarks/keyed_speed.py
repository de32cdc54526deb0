"""Decoding speed under the two samplers: rejection sampling against keyed (drafter-invariant) sampling,
plain and with an ngram drafter, on a spec's target and prompts (unpaired, alternating rounds: a check
that keyed sampling does not cost the rollout its speed, not a speedup claim).

    python benchmarks/keyed_speed.py smollm2-learn [--rows 64] [--tokens 32] [--rounds 2]

Prints seconds, tokens and tokens/s per (round, sampler, drafter).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch

    from workbench.audit.setup import audit_setup
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--k", type=int, default=3)
    a = ap.parse_args()
    spec = load_spec(a.spec)
    g = spec.grpo.group_size
    setup = audit_setup(spec, ["ngram"], max(1, a.rows // g), torch.device("cpu"))
    prompts = [p for p in setup.prompt_ids for _ in range(g)][: a.rows]
    groups = [i // g for i in range(len(prompts))]
    for r in range(a.rounds):
        for sampler in ("rejection", "keyed"):
            for kind, drafter in (("none", None), ("ngram", setup.drafters["ngram"])):
                sp = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.top_k, a.tokens,
                                    setup.tokenizer.eos_token_id, setup.stop_token_ids, sampler=sampler)  # fmt: skip
                eng = RolloutEngine(setup.lm, drafter, k=a.k)
                t = time.perf_counter()
                out = eng.generate(prompts, sp, torch.Generator().manual_seed(0), group_ids=groups)
                dt = time.perf_counter() - t
                n = sum(len(x) for x in out.tokens)
                print(f"round {r + 1} {sampler:9s} {kind:5s} {dt:6.2f} s {n} tokens {n / dt:6.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
