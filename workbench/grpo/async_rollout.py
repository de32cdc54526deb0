"""Asynchronous GRPO (``grpo.async``): a rollout worker process generates ahead of training.

Synchronous GRPO alternates: generate step t's rollouts with the policy after step t-1, then train
on them. Asynchronous GRPO (NeMo RL's async GRPO, verl's one-step off-policy trainer, AReaL)
overlaps the two: while step t trains, a worker with its own rollout engine and drafter generates
step t+s's rollouts with the weights it was last sent, so step t trains on rollouts of the policy
after step t-1-s (staleness s). The worker is a separate process (spawned, its own interpreter and
torch threads), so generation and training run on different cores.

Protocol (FIFO queues, so a generation always uses the weights sent before it):

    main                                   worker
    send_weights(version, state_dict) ->   load into its policy copy, its LeanLM, its drafter
    request(step, prompts, group_ids) ->   generate, then -> results: WorkerResult(step, version, output, seconds)
    close()                           ->   exit

Speculation stays exact with respect to the behaviour policy (the worker's weights), and the
drafter follows them (``Drafter.sync`` after every weight load). The main process reweights the
loss by truncated importance sampling against the rollouts' own log-probabilities
(:func:`workbench.grpo.loss.truncated_is_weight`).
"""

from __future__ import annotations

import queue
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.multiprocessing as mp

from workbench.grpo.config import TrainerConfig
from workbench.rollout.config import RolloutConfig
from workbench.rollout.engine import RolloutOutput

RESULT_TIMEOUT_S = 3600.0  # a step's rollouts; the worker's death is noticed sooner (is_alive checks)


@dataclass
class WorkerResult:
    """Rollouts of one step: ``version`` = optimiser steps of the weights they were sampled with;
    ``seconds``: the worker's generation time (wall clock, device-synchronised)."""

    step: int
    version: int
    output: RolloutOutput
    seconds: float


def check_async(rollout: RolloutConfig, paired: bool) -> None:
    """Refuse what asynchronous GRPO does not support yet, naming the fields.

    Args:
        rollout: the run's rollout description (its backend and drafter section).
        paired: whether the run times a paired autoregressive twin (``measure.paired`` with a drafter).
    Raises:
        ValueError: measure.paired on (the paired baseline runs in the trainer), online drafter
            adaptation (its updates would have to reach the worker), or rollout.backend=vllm (the
            worker builds the workbench engine).
    """
    if rollout.backend != "workbench":
        raise ValueError(
            f"grpo.async.enabled: the rollout worker runs the workbench engine, not rollout.backend="
            f"{rollout.backend}; set rollout.backend=workbench or grpo.async.enabled=false"
        )
    if paired:
        raise ValueError(
            "grpo.async.enabled: the paired autoregressive measurement runs in the trainer, not in the rollout "
            "worker; set measure.paired=false (compare with a synchronous run instead)"
        )
    if rollout.drafter.online.enabled and rollout.drafter.kind != "none":
        raise ValueError(
            "grpo.async.enabled with drafter.online.enabled: online drafter adaptation in the rollout worker is "
            "not supported yet; set drafter.online.enabled=false"
        )


class RolloutWorker:
    """The rollout worker process of asynchronous GRPO (see the module doc).

    Args:
        rollout: the trainer's rollout description (the worker builds its engine and drafter from it,
            with the same sampling, stop ids and engine options).
        config: the trainer's settings (the run's seed, ``grpo.group_size``, the policy's dtype).
        target_path: the policy checkpoint folder (its config, tokenizer and initial weights).
        drafter_init_path: the drafter's init checkpoint, or None.
        device: where the worker's engine runs (the trainer's device).
        threads: torch threads of the worker (the trainer keeps its own).
    Raises:
        RuntimeError: from :meth:`receive`, with the worker's traceback, if it failed or died.
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        config: TrainerConfig,
        target_path: Path,
        drafter_init_path: Path | None,
        device: torch.device,
        threads: int = 1,
    ):
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch/OpenMP state
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        args = (
            rollout,
            config,
            str(target_path),
            None if drafter_init_path is None else str(drafter_init_path),
            str(device),
            threads,
            self.requests,
            self.results,
        )
        self.process = ctx.Process(target=_worker_main, args=args, daemon=True, name="wb-rollout-worker")
        self.process.start()

    def send_weights(self, version: int, policy: torch.nn.Module) -> None:
        """Queue the policy's weights (a CPU copy) as ``version``; later requests use them."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        self.requests.put(("weights", version, state))

    def request(self, step: int, prompts: list[list[int]], group_ids: list[int]) -> None:
        """Queue the generation of ``step``'s rollouts (token-id prompts, group ids)."""
        self.requests.put(("gen", step, prompts, group_ids))

    def receive(self, timeout: float = RESULT_TIMEOUT_S) -> WorkerResult:
        """The next result (FIFO); raises RuntimeError if the worker failed or died."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"grpo.async: the rollout worker died (exit code {self.process.exitcode})"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"grpo.async: no rollouts from the worker in {timeout:.0f} s") from None
                continue
            if isinstance(msg, tuple) and msg and msg[0] == "error":
                raise RuntimeError(f"grpo.async: the rollout worker failed:\n{msg[1]}")
            return msg

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self.process.is_alive():
            try:
                self.requests.put(("stop",))
                self.process.join(timeout=10)
            finally:
                if self.process.is_alive():
                    self.process.terminate()
                    self.process.join(timeout=5)


def _worker_main(
    cfg: RolloutConfig,
    config: TrainerConfig,
    target_path: str,
    init_path: str | None,
    device_name: str,
    threads: int,
    requests,
    results,
) -> None:
    """The worker process: build the engine once, then serve weights and generation requests."""
    try:
        torch.set_num_threads(max(1, threads))
        from drafters import build_drafter
        from workbench.models import load_model
        from workbench.rollout.drafter import DrafterTarget
        from workbench.rollout.keyed import seeded
        from workbench.rollout_builder import build_backend, rollout_target
        from workbench.timing import timed

        device = torch.device(device_name)
        policy, tok = load_model(Path(target_path), device=device, dtype=getattr(torch, config.dtype))
        # the trainer's rollout description: the same sampling and stop ids, the same engine options
        # (packed weights, compile, CUDA graphs), built by the same builder
        lm = rollout_target(policy, cfg)
        drafter = build_drafter(
            cfg.drafter.kind,
            cfg.drafter,
            target=DrafterTarget(
                lm, tok, init_path=None if init_path is None else Path(init_path), path=Path(target_path)
            ),
            device=device,
        )
        backend = build_backend(cfg, lm, drafter)
        gen = torch.Generator(device).manual_seed(config.seed)  # the same stream a synchronous run samples from
        version = 0
        while True:
            msg = requests.get()
            if msg[0] == "stop":
                return
            if msg[0] == "weights":
                version, state = msg[1], msg[2]
                policy.load_state_dict(state)
                backend.load_policy_weights(policy)  # into the LeanLM (repacked if packed); the drafter synced
            elif msg[0] == "gen":
                _, step, prompts, group_ids = msg
                # keyed sampling: the row seeds a synchronous run's step would use, so the rollouts are its
                sp = seeded(cfg.sampling, config.seed, step, group_ids=group_ids, group_size=config.grpo.group_size)
                seconds, out = timed(lambda: backend.generate(prompts, sp, gen, group_ids), device)
                results.put(WorkerResult(step, version, out, seconds))
    except Exception:  # reported to the trainer, which raises it with this traceback
        results.put(("error", traceback.format_exc()))
