"""Accuracy of a spec's model before any training: greedy and at the rollouts' sampling settings, Wilson 95 % CIs.

    python benchmarks/real_model_accuracy.py smollm2 task.num_eval=128 [more dotted overrides]

Runs the trainer's own evaluation (the workbench engine, the spec's drafter, chat template and
rewards) on the held-out split; prints and writes JSON (``--out``) with accuracy and format rates.
"""

from __future__ import annotations

import argparse
import json
import time

from workbench.grpo.trainer import GRPOTrainer
from workbench.specs import load_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    spec = load_spec(a.spec, [*a.overrides, "grpo.eval_sampled=true", "measure.paired=false"])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(spec, progress=True)
    m = trainer.evaluate()
    m.update(seconds=time.perf_counter() - t0, num_eval=spec.task.num_eval, target=spec.model.target, task=spec.task.name,
             temperature=spec.rollout.temperature, max_new_tokens=spec.rollout.max_new_tokens)
    print(json.dumps(m, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
