"""One rank of tests/test_distributed.py's training check (run by torch.distributed's launcher).

Builds the micro trainer with grpo.backend=deepspeed, trains one GRPO optimiser step on its half
of a fixed synthetic batch (tests/test_distributed.py:fixed_batch) and, on rank 0, saves the loss
stats and the updated policy weights (gathered under ZeRO-3) to argv[1].
"""

import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_distributed import OVERRIDES, fixed_batch  # noqa: E402

from workbench.grpo.distributed import shard_range  # noqa: E402
from workbench.grpo.trainer import GRPOTrainer  # noqa: E402
from workbench.specs import load_spec  # noqa: E402


def main(out_path: str, stage: str) -> None:
    spec = load_spec("micro", OVERRIDES + ["grpo.backend=deepspeed", f"grpo.zero_stage={stage}"])
    trainer = GRPOTrainer(spec, progress=False)
    ids, mask, logp, adv = fixed_batch(trainer)
    dp = trainer.dp
    rows = shard_range(ids.shape[0], dp.rank, dp.world_size)
    stats = trainer._train(ids[rows], mask[rows], logp[rows], None, adv[rows])
    with dp.gathered(trainer.policy, spec.grpo.zero_stage):
        state = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    if dp.is_main:
        torch.save({"stats": stats, "state": state, "world_size": dp.world_size}, out_path)


def online(out_path: str) -> None:
    """Two GRPO steps with online draft_model adaptation: rank 0 saves every rank's drafter weights."""
    spec = load_spec("micro", ["grpo.eval_every=0", "measure.modeled=false", "tracking.enabled=false", "grpo.backend=deepspeed",
                               "drafter.kind=draft_model", "drafter.online.enabled=true", "drafter.online.lr=1e-2"])
    trainer = GRPOTrainer(spec, progress=False)
    before = [p.detach().clone() for p in trainer.drafter.train_parameters()]
    for step in (1, 2):
        trainer.step(step)
    after = [p.detach().clone() for p in trainer.drafter.train_parameters()]
    every = trainer.dp.gather((before, after))
    if trainer.dp.is_main:
        torch.save(every, out_path)


if __name__ == "__main__":
    online(sys.argv[1]) if sys.argv[2] == "online" else main(sys.argv[1], sys.argv[2])
