"""TRL's GRPOTrainer on the real model, generating with TRL's own ``generate()`` or through the workbench.

An example to copy (TRL's own ``accuracy_reward`` on the real-model task, chat prompts rendered by the
rollout function) and a paired measurement of what the rollout function changes:

    python benchmarks/trl_rollout.py --steps 2 --repeats 1                   # a smoke run
    python benchmarks/trl_rollout.py --arms trl,workbench,workbench:ngram --steps 5 --repeats 3 \\
        --out benchmarks/trl-rollout-smollm2-cpu.json

Arms: ``trl`` (no rollout_func: transformers' ``generate()``), ``workbench`` (the adapter, plain
decoding), ``workbench:KIND`` (the adapter speculating with drafter KIND, k = ``--k``). Each repeat
runs every arm from the same initial weights and seed (so the same prompts at each step), in an
order rotated per repeat. Timed per step: the whole optimiser step and TRL's ``_generate`` (the
generation stage, seconds). The first step of each run is warm-up (engine build, first-call
allocation) and is left out. Ratios pair the same step of the same repeat (same prompts):
``trl`` seconds / arm seconds, geometric mean with a Student-t 95 % interval on the logs
(``workbench.stats.ratio_ci``); the steps of one repeat are not independent, so the interval
is a floor. Completions differ between arms (each samples its own), so tokens/s is given too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from workbench.models import resolve_model
from workbench.specs import load_spec
from workbench.stats import paired_ratios, ratio_ci
from workbench.tasks.loading import spec_task_data
from workbench.timing import host_description


def chat_dataset(spec, n: int):
    """The spec's task as TRL's conversational dataset: ``prompt`` messages and ``solution``."""
    rows = spec_task_data(spec.task, "train", n, spec.seed)
    system = [{"role": "system", "content": spec.task.system_prompt}] if spec.task.system_prompt else []
    return rows.map(
        lambda r: {"prompt": system + [{"role": "user", "content": r["prompt"]}], "solution": str(r["answer"])},
        remove_columns=rows.column_names,
    )


def run_arm(arm: str, spec_name: str, overrides: list[str], a) -> dict:
    """One TRL training run of ``a.steps`` steps with ``arm``'s generation; per-step seconds."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import accuracy_reward

    from workbench.integrations.trl import workbench_rollout_func

    spec = load_spec(spec_name, overrides)
    path = resolve_model(spec.model.target, progress=False)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    r, g = spec.rollout, spec.grpo
    args = GRPOConfig(
        output_dir=a.output_dir,
        per_device_train_batch_size=g.prompts_per_step * g.group_size,
        num_generations=g.group_size,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        learning_rate=g.lr,
        beta=g.beta,
        epsilon=g.clip_low,
        epsilon_high=g.clip_high,
        loss_type="dapo",
        max_steps=a.steps,
        logging_steps=1,
        seed=a.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        save_strategy="no",
        report_to=["mlflow"] if a.mlflow else [],
        run_name=f"trl-{arm}",
    )
    rollout = None
    if arm != "trl":
        kind = arm.split(":", 1)[1] if ":" in arm else "none"
        rollout = workbench_rollout_func(
            spec_name, [*overrides, f"drafter.kind={kind}", f"drafter.k={a.k}", "drafter.online.enabled=false"]
        )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=accuracy_reward,
        args=args,
        processing_class=AutoTokenizer.from_pretrained(path),
        train_dataset=chat_dataset(spec, g.prompts_per_step * (a.steps + 1)),
        rollout_func=rollout,
    )
    gen_s, step_s, tokens = [], [], []
    generate = trainer._generate

    def timed_generate(prompts):  # TRL's generation stage, whichever engine runs it
        t0 = time.perf_counter()
        out = generate(prompts)
        gen_s.append(time.perf_counter() - t0)
        tokens.append(sum(len(c) for c in out[1]))  # (prompt_ids, completion_ids, ...)
        return out

    trainer._generate = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kw):
            step_s.append(time.perf_counter() - self.t0)

    trainer.add_callback(StepTimer())
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "arm": arm,
        "step_s": step_s,
        "gen_s": gen_s,
        "completion_tokens": tokens,
        "reward": [h.get("reward") for h in logs],
        "acceptance_length": [h.get("spec/acceptance_length") for h in logs],
    }


def summarise(runs: list[dict], arms: list[str], warmup: int = 1) -> dict:
    """Per arm: trl / arm seconds per step and per generation stage, paired by (repeat, step)."""
    out = {}
    base = [r for r in runs if r["arm"] == "trl"]
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        s = {
            "gen_s_mean": sum(sum(r["gen_s"][warmup:]) for r in mine)
            / max(sum(len(r["gen_s"][warmup:]) for r in mine), 1),
            "tokens_per_s": sum(sum(r["completion_tokens"][warmup:]) for r in mine)
            / max(sum(sum(r["gen_s"][warmup:]) for r in mine), 1e-9),
        }
        if arm != "trl" and base:
            for key in ("step_s", "gen_s"):
                ratios = [x for b, m in zip(base, mine) for x in paired_ratios(b[key][warmup:], m[key][warmup:])]
                ci = ratio_ci(ratios)
                s[f"speedup_{key}"] = {"ratio": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}
        out[arm] = s
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="smollm2-learn")
    p.add_argument("--arms", default="trl,workbench,workbench:eagle3")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mlflow", action="store_true", help="report_to=mlflow (TRL's own callback; $MLFLOW_TRACKING_URI)")
    p.add_argument("--output-dir", default="/tmp/trl-rollout")
    p.add_argument("--out", type=Path)
    p.add_argument("overrides", nargs="*", help="dotted overrides of the spec, e.g. rollout.max_new_tokens=64")
    a = p.parse_args()
    arms = a.arms.split(",")
    runs = []
    for rep in range(a.repeats):
        for arm in arms[rep % len(arms) :] + arms[: rep % len(arms)]:
            runs.append({"repeat": rep, **run_arm(arm, a.spec, a.overrides, a)})
            print(json.dumps({k: runs[-1][k] for k in ("repeat", "arm", "step_s", "gen_s")}), flush=True)
            if a.out:  # written after every run, so a stopped measurement keeps what it measured
                a.out.write_text(json.dumps(result_of(runs, arms), indent=1) + "\n")
    result = result_of(runs, arms)
    print(json.dumps(result["summary"], indent=1))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


def result_of(runs: list[dict], arms: list[str]) -> dict:
    """The JSON written to ``--out``: command, host, per-arm summary over complete repeats, every run."""
    runs = sorted(runs, key=lambda r: (r["repeat"], arms.index(r["arm"])))
    done = [r for r in runs if sum(q["repeat"] == r["repeat"] for q in runs) == len(arms)]
    return {
        "command": "python " + " ".join(sys.argv),
        "host": host_description(torch.device("cpu")),
        "torch": torch.__version__,
        "summary": summarise(done, arms),
        "runs": runs,
    }


if __name__ == "__main__":
    main()
