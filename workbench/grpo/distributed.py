"""Data-parallel GRPO ranks under DeepSpeed ZeRO (``grpo.backend: deepspeed``).

Each rank generates its share of the step's prompt groups with its own rollout engine and drafter,
computes rewards and advantages for its groups (a group never spans ranks, so per-group advantages
are exact), and trains the one policy under DeepSpeed ZeRO stage ``grpo.zero_stage``: gradients
are averaged over ranks by DeepSpeed, so each rank weights its micro-batch losses by its share of
the *global* batch (tokens for ``token_mean``, sequences otherwise) times the world size, and the
averaged gradient is the single-process gradient of the whole batch. torch.distributed (gloo on
CPU, NCCL on CUDA) carries the few small collectives of the loop itself: the global token count,
the step's metrics, the drafter's gradients under online adaptation.

Launch: ``wb run --nproc N`` (torch.distributed's elastic launcher, ``torchrun``), or ``torchrun`` /
``deepspeed`` directly on a multi-GPU node: ranks are read from the launcher's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``). Method: ZeRO (Rajbhandari et al., arXiv 1910.02054);
the split of rollouts by prompt group is verl's and NeMo RL's data-parallel rollout layout.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from workbench import metrics as M
from workbench.rollout.counters import SpecCounters
from workbench.rollout.engine import RolloutOutput
from workbench.specs.sections import GRPOSpec


def launched_world_size() -> int:
    """``WORLD_SIZE`` set by a launcher (torchrun, deepspeed), 1 when none launched this process."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_distributed(g: GRPOSpec, world_size: int) -> None:
    """Refuse what ``world_size`` data-parallel ranks cannot run with the GRPO section ``g``, naming
    the field and the fix.

    Raises:
        ValueError: ranks launched with ``grpo.backend: single``; prompt groups that do not divide
            evenly over the ranks; ``grpo.async.enabled`` with the deepspeed backend.
    """
    if g.backend == "single":
        if world_size > 1:
            raise ValueError(
                f"grpo.backend: {world_size} ranks were launched but the backend is 'single'; "
                "set grpo.backend=deepspeed (or run one process)"
            )
        return
    if g.prompts_per_step % world_size:
        raise ValueError(
            f"grpo.prompts_per_step: {g.prompts_per_step} prompt groups do not split evenly over {world_size} "
            f"ranks; use a multiple of {world_size} (each rank generates whole groups)"
        )
    if g.async_.enabled:
        raise ValueError(
            "grpo.async.enabled with grpo.backend=deepspeed: asynchronous GRPO runs in one process so far; "
            "set grpo.async.enabled=false or grpo.backend=single"
        )


def deepspeed_config(g: GRPOSpec, dtype: str, n_local: int, world_size: int) -> dict:
    """The DeepSpeed config of the policy's training (GRPO section ``g``, weights in ``dtype``) for
    ``n_local`` sequences per rank and step.

    One optimiser step per GRPO step, as in the single process: the rank's micro-batches
    (``grpo.micro_batch_size`` sequences) are DeepSpeed's gradient-accumulation steps. AdamW is
    torch's (``torch_adam``: no compiled op needed, the same update as the single process's), clipped
    at ``grpo.max_grad_norm``; bfloat16/float16 weights train with DeepSpeed's float32 master copy.
    """
    micro = min(g.micro_batch_size, n_local)
    gas = -(-n_local // micro)
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "train_batch_size": micro * gas * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": g.lr, "weight_decay": g.weight_decay, "torch_adam": True}},
        "gradient_clipping": g.max_grad_norm,
        "zero_optimization": {"stage": g.zero_stage},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if dtype in ("bfloat16", "float16"):
        cfg["bf16" if dtype == "bfloat16" else "fp16"] = {"enabled": True}
    return cfg


def shard_range(n: int, rank: int, world_size: int) -> slice:
    """The contiguous slice of ``n`` items (prompt groups) that ``rank`` owns; ``n % world_size == 0``."""
    per = n // world_size
    return slice(rank * per, (rank + 1) * per)


def reduce_step_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank: each ``timing_s/*`` (seconds) is the slowest rank's (the
    step waits for it), with the spread of generation as ``timing_s/gen_max`` and ``timing_s/gen_min``;
    any other key is the mean over the ranks that have it (e.g. ``speedup/gen_modeled``)."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_rank for k in m):
        vals = [m[key] for m in per_rank if key in m]
        out[key] = max(vals) if key.startswith(M.TIMING) else sum(vals) / len(vals)
    gens = [m[M.GEN_S] for m in per_rank if M.GEN_S in m]
    if gens:
        out[M.GEN_MAX_S], out[M.GEN_MIN_S] = max(gens), min(gens)
    for key in [k for k in out if k.startswith(M.TIMING_FRAC)]:  # shares of the (slowest) step
        out[key] = out.get(M.timing(key.split("/", 1)[1]), 0.0) / max(out.get(M.STEP_S, 0.0), 1e-9)
    return out


def merge_counters(parts: list[SpecCounters]) -> SpecCounters:
    """The ranks' acceptance counters summed (forward lists concatenated in rank order)."""
    total = SpecCounters(k=parts[0].k)
    for c in parts:
        total.merge(c)
    return total


@dataclass
class DataParallel:
    """This process's place among the data-parallel ranks, and the loop's collectives."""

    rank: int
    world_size: int
    local_rank: int
    comm_device: torch.device = torch.device("cpu")  # where collective tensors live (NCCL: this rank's GPU)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, device_type: str) -> "DataParallel":
        """Join (or, alone, form) the process group: gloo on CPU, NCCL on CUDA, via DeepSpeed.

        A process no launcher started forms a world of one on a free local port. SIGTERM (what
        the launcher sends the other ranks when one fails) becomes SystemExit, so this rank's
        MLflow run is ended FAILED, not left RUNNING. A group formed here is destroyed at exit, while
        the interpreter is still whole: a gloo group left to interpreter teardown can abort the rank
        (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#190489).

        Raises:
            ValueError: DeepSpeed is not installed (names grpo.backend and the fix).
        """
        try:
            import deepspeed
        except ImportError as e:
            raise ValueError(
                "grpo.backend: deepspeed is not installed; pip install deepspeed (or set grpo.backend=single)"
            ) from e
        if "RANK" not in os.environ:  # one process, no launcher: a world of one
            os.environ.update(
                {
                    "RANK": "0",
                    "WORLD_SIZE": "1",
                    "LOCAL_RANK": "0",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": os.environ.get("MASTER_PORT", str(_free_port())),
                }
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        comm = torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(local_rank)
            comm = torch.device("cuda", local_rank)
        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if device_type == "cuda" else "gloo", verbose=False)
            atexit.unregister(_destroy_group)  # once, however many times a process forms a group
            atexit.register(_destroy_group)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, comm)

    def device(self, device: torch.device) -> torch.device:
        """cuda -> this rank's GPU (``cuda:LOCAL_RANK``); cpu unchanged."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" else device

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the body first (building models, measuring cost curves into the shared cache);
        the other ranks then run it and find what it built."""
        if not self.is_main:
            dist.barrier()
        try:
            yield
        finally:
            if self.is_main:
                dist.barrier()

    def wrap_policy(self, policy: torch.nn.Module, g: GRPOSpec, dtype: str, n_local: int):
        """``deepspeed.initialize`` of the policy with :func:`deepspeed_config`; returns the engine."""
        import deepspeed

        cfg = deepspeed_config(g, dtype, n_local, self.world_size)
        params = [p for p in policy.parameters() if p.requires_grad]
        engine, _, _, _ = deepspeed.initialize(model=policy, model_parameters=params, config=cfg)
        return engine

    def gathered(self, module: torch.nn.Module, zero_stage: int):
        """Context in which ``module``'s ZeRO-3 shards are gathered into full parameters (read-only):
        the ``prepare`` stage copies them into the rollout engine. A no-op below stage 3."""
        if zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)

    def sum(self, values: list[float] | torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks of a float vector (float64 on the host: exact for counts)."""
        t = torch.as_tensor(values, dtype=torch.float64).detach().clone().to(self.comm_device)
        dist.all_reduce(t)
        return t.cpu()

    def average_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Average ``params``' gradients over ranks in place (data-parallel drafter training: identical
        drafters on every rank as long as they start identical)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads]).to(self.comm_device)
        dist.all_reduce(flat)
        flat /= self.world_size
        i = 0
        for g in grads:
            g.copy_(flat[i : i + g.numel()].view_as(g))
            i += g.numel()

    def gather_step(self, m: dict[str, float], out: RolloutOutput, rewards: torch.Tensor, paired: RolloutOutput | None):
        """The step as one process would see it, on every rank: metrics by :func:`reduce_step_metrics`,
        every rank's completions and the paired twin's (rank order, so the groups stay contiguous;
        log-probs are left out: nothing downstream reads them), summed acceptance counters, rewards (N_global,)."""
        parts = self.gather(
            (
                m,
                out.tokens,
                out.finish_reasons,
                out.counters,
                rewards.tolist(),
                (paired.tokens, paired.counters) if paired is not None else None,
            )
        )
        tokens = [t for p in parts for t in p[1]]
        merged = RolloutOutput(
            tokens, [[] for _ in tokens], [r for p in parts for r in p[2]], merge_counters([p[3] for p in parts])
        )
        all_rewards = torch.tensor([r for p in parts for r in p[4]], dtype=rewards.dtype, device=rewards.device)
        if paired is not None:
            twin = [t for p in parts for t in p[5][0]]
            paired = RolloutOutput(twin, [[] for _ in twin], [], merge_counters([p[5][1] for p in parts]))
        return reduce_step_metrics([p[0] for p in parts]), merged, all_rewards, paired

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_rank(code: int = 0) -> NoReturn:
    """End a launched rank's process once its work is done: the exit handlers run (MLflow ends its run,
    the process group is destroyed), the streams are flushed, and the process exits without the
    interpreter's teardown, as :mod:`multiprocessing` ends its children (exit functions, then
    ``os._exit``). In that teardown a rank of a finished two-rank ZeRO-3 run was seen to abort (SIGABRT,
    "terminate called without an active exception"), and the launcher then failed the whole run.
    ``code``: the process's exit status."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _exit_on_sigterm(signum, frame):  # noqa: ARG001
    raise SystemExit(128 + signum)
