"""Your own Hugging Face checkpoint, your own dataset and your own reward function, through the workbench.

    python examples/own_model_data_reward.py                 # 4 GRPO steps, ngram drafting at k = 3
    python examples/own_model_data_reward.py --steps 1 --model ORG/NAME   # a Hub id (its cache, or a download)

Without a model argument it writes a checkpoint folder itself (the embedded ``micro`` preset saved with
``save_pretrained``: any folder with ``config.json`` works the same way), so it runs offline. The data is a
jsonl file of ``prompt`` / ``answer`` rows; the reward is :func:`my_rewards.exact_number` plus a small
:func:`my_rewards.brevity` term, both with TRL's reward-function signature, named in the spec by reference.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # `my_rewards` is importable by reference (task.reward: my_rewards:...)


def write_dataset(path: Path, n: int = 64, seed: int = 0) -> Path:
    """``n`` addition problems as jsonl rows {"prompt", "answer"}."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            f.write(json.dumps({"prompt": f"{a} + {b} =", "answer": str(a + b)}) + "\n")
    return path


def write_checkpoint(folder: Path) -> Path:
    """A local Hugging Face checkpoint folder (config.json, safetensors, tokenizer) made from the micro preset."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models import resolve_model

    src = resolve_model("micro", progress=False)
    AutoModelForCausalLM.from_pretrained(src).save_pretrained(folder)
    AutoTokenizer.from_pretrained(src).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a checkpoint folder or a Hub id (default: one written here)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("example-own"), help="folder for the data and the checkpoint")
    args = ap.parse_args(argv)

    import workbench as wb

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or str(write_checkpoint(args.out / "checkpoint"))
    data = write_dataset(args.out / "train.jsonl")
    spec = wb.load_spec(
        "micro",
        [
            f"model.target={model}",
            f"task.path={data}",
            "task.reward=[my_rewards:exact_number, my_rewards:brevity]",
            "task.reward_weights=[1.0, 0.1]",
            "task.num_eval=0",
            "grpo.eval_every=0",
            f"grpo.steps={args.steps}",
            "drafter.method=ngram",  # vLLM's names work: drafter.kind / drafter.k are the spec's own
            "drafter.num_speculative_tokens=3",
            "tracking.experiment=example-own",
        ],
    )
    result = wb.run(spec, progress=True)
    rewards = [h["reward/mean"] for h in result.history]
    print(f"run {result.run_id}: reward/mean per step {[round(r, 3) for r in rewards]}")
    return rewards[-1]


if __name__ == "__main__":
    main()
