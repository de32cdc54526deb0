"""One rank of tests/test_distributed.py's training check (run by torch.distributed's launcher).

Builds the micro trainer with grpo.backend=deepspeed, trains one GRPO optimiser step on its half
of a fixed synthetic batch (tests/test_distributed.py:fixed_batch) and, on rank 0, saves the loss
stats and the updated policy weights (gathered under ZeRO-3) to argv[1]; then trains on a batch
without signal and on one with a non-finite gradient and saves whether either moved a weight.
"""

import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from workbench.grpo.distributed import exit_rank, shard_range  # noqa: E402
from workbench.grpo.trainer import GRPOTrainer  # noqa: E402
from workbench.run_build import build_parts
from workbench.specs import load_spec  # noqa: E402

from test_distributed import OVERRIDES, fixed_batch  # noqa: E402


def main(out_path: str, stage: str) -> None:
    spec = load_spec("micro", OVERRIDES + ["grpo.backend=deepspeed", f"grpo.zero_stage={stage}"])
    trainer = GRPOTrainer(build_parts(spec, progress=False))
    ids, mask, logp, adv = fixed_batch(trainer)
    dp = trainer.dp
    rows = shard_range(ids.shape[0], dp.rank, dp.world_size)
    stats = trainer._train(ids[rows], mask[rows], logp[rows], None, adv[rows])
    state = _state(trainer)
    # then a batch without signal (every advantage 0) and one whose gradient is not finite: neither may
    # move a weight (AdamW's momentum from the first step would), and each counts as skipped
    after = {}
    for name, a in (("zero_signal", torch.zeros_like(adv)), ("non_finite", adv.clone().fill_(float("inf")))):
        s = trainer._train(ids[rows], mask[rows], logp[rows], None, a[rows])
        after[name] = (s["train/step_skipped"], all(torch.equal(v, state[k]) for k, v in _state(trainer).items()))
    if dp.is_main:
        torch.save({"stats": stats, "state": state, "world_size": dp.world_size, "after": after}, out_path)


def _state(trainer) -> dict:
    with trainer.dp.gathered(trainer.policy, trainer.config.grpo.zero_stage):
        return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}


def online(out_path: str) -> None:
    """Two GRPO steps with online draft_model adaptation: rank 0 saves every rank's drafter weights."""
    spec = load_spec(
        "micro",
        [
            "grpo.eval_every=0",
            "measure.modeled=false",
            "tracking.enabled=false",
            "grpo.backend=deepspeed",
            "drafter.kind=draft_model",
            "drafter.online.enabled=true",
            "drafter.online.lr=1e-2",
        ],
    )
    trainer = GRPOTrainer(build_parts(spec, progress=False))
    before = [p.detach().clone() for p in trainer.drafter.train_parameters()]
    for step in (1, 2):
        trainer.step(step)
    after = [p.detach().clone() for p in trainer.drafter.train_parameters()]
    every = trainer.dp.gather((before, after))
    if trainer.dp.is_main:
        torch.save(every, out_path)


if __name__ == "__main__":
    online(sys.argv[1]) if sys.argv[2] == "online" else main(sys.argv[1], sys.argv[2])
    exit_rank(0)  # as `wb run`'s ranks end: no interpreter teardown, where a finished ZeRO-3 rank can abort
