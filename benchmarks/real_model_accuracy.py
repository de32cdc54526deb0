"""Accuracy of a spec's model before any training: greedy and at the rollouts' sampling settings, Wilson 95 % CIs.

    python benchmarks/real_model_accuracy.py smollm2 task.num_eval=128 [more dotted overrides]

Runs the trainer's own evaluation (the workbench engine, the spec's drafter, chat template and
rewards) on the held-out split; prints and writes JSON (``--out``) with accuracy and format rates;
``--samples FILE`` also writes every scored completion (jsonl: arm, prompt, answer, completion, rewards).
"""

from __future__ import annotations

import argparse
import json
import time

import workbench.grpo.trainer as trainer_module
from workbench.grpo.trainer import GRPOTrainer
from workbench.run_build import build_parts
from workbench.specs import load_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--out", default=None)
    ap.add_argument("--samples", default=None, help="jsonl file for every scored completion (greedy arm first)")
    a = ap.parse_args()
    spec = load_spec(a.spec, [*a.overrides, "grpo.eval_sampled=true", "measure.paired=false"])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(build_parts(spec, progress=True))
    scored: list[tuple[list[str], list[str]]] = []
    if a.samples:  # record what evaluate() scores, arm by arm, without changing it
        score = trainer_module.score

        def recording_score(task, texts, answers, *args, **kw):
            scored.append((list(texts), list(answers)))
            return score(task, texts, answers, *args, **kw)

        trainer_module.score = recording_score
    m = trainer.evaluate()
    if a.samples:
        trainer_module.score = score
        task = trainer.task
        with open(a.samples, "w") as f:
            for arm, (texts, answers) in zip(("greedy", "sampled"), scored):
                for prompt, answer, text in zip(trainer.eval_data["prompt"], answers, texts):
                    fmt = task.format_reward(text) if task.format_reward else None
                    f.write(
                        json.dumps(
                            {
                                "arm": arm,
                                "prompt": prompt,
                                "answer": answer,
                                "completion": text,
                                "accuracy": task.reward(text, answer),
                                "format": fmt,
                            }
                        )
                        + "\n"
                    )
    m.update(
        seconds=time.perf_counter() - t0,
        num_eval=spec.task.num_eval,
        target=spec.model.target,
        task=spec.task.name,
        temperature=spec.rollout.temperature,
        max_new_tokens=spec.rollout.max_new_tokens,
    )
    print(json.dumps(m, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
