"""Continuous batching vs consecutive chunks (issue #24, item 3), measured paired on one spec.

One GRPO step's rollouts (``grpo.prompts_per_step`` prompts × ``grpo.group_size``, sampled at the
spec's temperature with EOS, ``rollout.max_batch_size`` rows in flight) are generated four ways,
interleaved per repeat (repeat r uses generator seed r for all four, so a load spike hits all alike):
autoregressive and speculative (``--drafter``, ``--k``), each with ``rollout.continuous_batching``
true and false. Reported with 95 % Student-t CIs on the per-repeat log ratios (docs/design.md §8):
the gain of continuous batching for each arm (chunked s / continuous s), and the speculative
speedup (autoregressive s / speculative s) under each batching.

    python benchmarks/continuous_batching.py --spec membound --drafter eagle3 --k 3 --repeats 9

Writes ``--out`` (JSON) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from workbench.drafter_init import drafter_as_run
from workbench.grpo.build import resolve_device
from workbench.models import load_model, resolve_model
from workbench.models.tokenizer import encode_prompt
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.specs import load_spec
from workbench.specs.resolve import drafter_init_config
from workbench.stats import paired_ratios, ratio_ci
from workbench.tasks.loading import load_task_data
from workbench.timing import timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="membound")
    ap.add_argument("--drafter", default="eagle3")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default="benchmarks/continuous-batching-cpu.json")
    ap.add_argument("overrides", nargs="*", help="dotted-key spec overrides")
    a = ap.parse_args()
    spec = load_spec(a.spec, [*a.overrides, f"drafter.kind={a.drafter}", f"drafter.k={a.k}"])
    dev = resolve_device(spec.model.device)
    path = resolve_model(spec.model.target, what="model.target")
    hf, tok = load_model(path, device=str(dev), dtype=spec.model.dtype)
    lm = LeanLM.from_hf(hf, what="model.target")
    drafter = drafter_as_run(drafter_init_config(spec), lm, tok, path, dev, progress=True)
    g, r = spec.grpo, spec.rollout
    rows = list(load_task_data(spec.task.name, "train", g.prompts_per_step, spec.seed)["prompt"])
    prompts = [encode_prompt(tok, p) for p in rows for _ in range(g.group_size)]  # a GRPO step: G rollouts per prompt
    sp = SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, tok.eos_token_id)
    engines = {
        (arm, mode): RolloutEngine(
            lm,
            drafter if arm == "spec" else None,
            k=a.k,
            max_batch_size=r.max_batch_size,
            continuous=mode == "continuous",
        )
        for arm in ("ar", "spec")
        for mode in ("continuous", "chunks")
    }
    times: dict = {key: [] for key in engines}
    tokens: dict = {key: [] for key in engines}
    t0 = time.perf_counter()
    for rep in range(a.repeats + 1):  # repeat 0 warms up and is dropped
        for key, eng in engines.items():
            dt, out = timed(lambda: eng.generate(prompts, sp, torch.Generator().manual_seed(rep)))
            if rep:
                times[key].append(dt)
                tokens[key].append(sum(map(len, out.tokens)))
    res = {
        "spec": a.spec,
        "drafter": a.drafter,
        "k": a.k,
        "rows": len(prompts),
        "max_batch_size": r.max_batch_size,
        "repeats": a.repeats,
        "wall_s": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
        "median_s": {f"{arm}/{mode}": sorted(v)[len(v) // 2] for (arm, mode), v in times.items()},
        "mean_tokens": {f"{arm}/{mode}": sum(v) / len(v) for (arm, mode), v in tokens.items()},
    }
    cis = {
        "continuous gain, autoregressive (chunks s / continuous s)": (
            times[("ar", "chunks")],
            times[("ar", "continuous")],
        ),
        f"continuous gain, {a.drafter} k={a.k}": (times[("spec", "chunks")], times[("spec", "continuous")]),
        f"{a.drafter} k={a.k} speedup, chunks": (times[("ar", "chunks")], times[("spec", "chunks")]),
        f"{a.drafter} k={a.k} speedup, continuous": (times[("ar", "continuous")], times[("spec", "continuous")]),
    }
    res["ratios"] = {}
    print(
        f"| ratio ({len(prompts)} rows, {r.max_batch_size} in flight, {a.repeats} paired repeats) | geometric mean "
        "[95 % CI] |\n|---|---|"
    )
    for name, (num, den) in cis.items():
        ci = ratio_ci(paired_ratios(num, den))
        res["ratios"][name] = {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}
        print(f"| {name} | {ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}] |")
    print("median seconds:", {k: round(v, 3) for k, v in res["median_s"].items()}, "tokens:", res["mean_tokens"])
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
