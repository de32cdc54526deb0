"""What vLLM's per-request seeds do with speculative decoding: the same prompts, the same ``SamplingParams(seed=...)``,
with and without ``speculative_config`` (ngram), on the embedded ``tiny`` preset.

    LD_PRELOAD=$(python -c "from workbench.vllm.runtime.preload import wanted; print(':'.join(wanted().libs))") \\
      python benchmarks/vllm_seeds.py benchmarks/vllm_seeds.json [--cpu-expand-fix]

(the preload is vLLM-CPU's install guide's, as ``wb`` sets it for its vLLM commands). Prints, per sampling
setting, how many rows are token-for-token equal between plain and plain (the seeds fix plain decoding),
speculative and speculative (they fix speculative decoding), plain and speculative (the question), and where
a plain/speculative pair first differs. The ngram drafts are accepted on these prompts (repeating patterns;
the acceptance printed), so verification runs.
"""

from __future__ import annotations

import dataclasses
import json
import sys

ROWS = 64
PROMPTS = [[1, 5, 9, 12, 5, 9, 12, 5, 9], [1, 30, 31, 32, 30, 31, 32, 30], [1, 17, 18, 19, 17, 18, 19]]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> dict:
    import torch

    from workbench.cli.common import _load
    from workbench.models import resolve_model
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs.resolve import rollout_config
    from workbench.vllm.runtime.engine import VLLMEngine
    from workbench.vllm.speculative import speculative_config

    torch.manual_seed(0)
    path = resolve_model("tiny")
    spec = _load("quickstart", ["rollout.backend=vllm", "drafter.kind=ngram", "drafter.k=3", "drafter.init.data=none"])
    fix = "--cpu-expand-fix" in sys.argv
    cfg = rollout_config(spec).vllm
    cfg = dataclasses.replace(cfg, cpu_expand_fix=fix)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(ROWS)]
    seeds = [1000 + i for i in range(ROWS)]
    plain = VLLMEngine(path, cfg, "cpu", None, seed=0)
    specd = VLLMEngine(path, cfg, "cpu", speculative_config(spec.drafter, None), seed=0)
    results = {
        "vllm": __import__("vllm").__version__, "rows": ROWS, "k": 3, "drafter": "ngram", "cpu_expand_fix": fix,
        "settings": [],
    }  # fmt: skip
    try:
        for temp, top_p in ((0.7, 1.0), (1.0, 0.95)):
            sp = SamplingParams(temp, top_p, 0, 32, None)
            p1, p2 = plain.generate(prompts, sp, seeds).tokens, plain.generate(prompts, sp, seeds).tokens
            s1 = specd.generate(prompts, sp, seeds)
            s2 = specd.generate(prompts, sp, seeds).tokens
            diffs = [first_difference(a, b) for a, b in zip(p1, s1.tokens)]
            row = {
                "temperature": temp,
                "top_p": top_p,
                "plain_vs_plain_equal": sum(a == b for a, b in zip(p1, p2)),
                "spec_vs_spec_equal": sum(a == b for a, b in zip(s1.tokens, s2)),
                "plain_vs_spec_equal": sum(d is None for d in diffs),
                "first_difference_positions": sorted(d for d in diffs if d is not None)[:20],
                "acceptance_length": s1.counters.metrics().get("spec/acceptance_length"),
            }
            results["settings"].append(row)
            print(json.dumps(row))
    finally:
        plain.close()
        specd.close()
    return results


if __name__ == "__main__":
    out = main()
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    if files:
        with open(files[0], "w") as f:
            json.dump(out, f, indent=1)
