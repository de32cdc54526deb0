"""TRL's GRPOTrainer generating through the workbench's speculative engine (``workbench_rollout_func``).

    pip install -e ".[trl]"
    python examples/trl_grpo.py                      # the micro model, offline, 4 steps, ngram at k = 3
    python examples/trl_grpo.py --model HuggingFaceTB/SmolLM2-135M-Instruct --steps 20   # a Hub model

TRL owns the model, the data, the reward and the optimiser; the workbench spec says only how rollouts are
generated (its ``rollout`` and ``drafter`` sections): speculative, exact, with the acceptance counters and
generation times appended to TRL's logged metrics (``spec/acceptance_length``, ``timing_s/gen``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a checkpoint folder or Hub id (default: the micro preset)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--drafter", default="ngram", help="drafter.kind: none, ngram, suffix, draft_model, ...")
    ap.add_argument("--out", type=Path, default=Path("example-trl"))
    args = ap.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16

    import torch
    from datasets import Dataset
    from my_rewards import exact_number
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from workbench.integrations.trl import workbench_rollout_func
    from workbench.models import resolve_model

    model_id = args.model or str(resolve_model("micro", progress=False))
    model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    rows = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    data = Dataset.from_dict({"prompt": [f"{a} + {b} =" for a, b in rows], "answer": [str(a + b) for a, b in rows]})
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=exact_number,
        train_dataset=data,
        args=GRPOConfig(
            output_dir=str(args.out),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=24,
            temperature=1.0,
            learning_rate=1e-4,
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            seed=0,
        ),
        rollout_func=workbench_rollout_func("micro", [f"drafter.kind={args.drafter}", "drafter.k=3"]),
    )
    trainer.train()
    last = {k: v for k, v in trainer.state.log_history[-2].items() if isinstance(v, float)}
    print({k: round(v, 3) for k, v in last.items() if k.startswith(("reward", "spec/", "timing_s/"))})
    return last


if __name__ == "__main__":
    main()
