"""The engine the audit samples through: the workbench engine as `wb run` may configure it.

A bare ``RolloutEngine(target, drafter, k)`` speculates k tokens every step and retires finished
rows at once, so an audit of it says nothing of the paths a run takes with ``drafter.adaptive``
(k_t chosen per step, 0 = a plain step), ``rollout.cuda_graphs`` (the batch shrinking only to
capture sizes, finished rows riding along) or ``rollout.compile``.
:class:`EngineOptions` turns each on.

Adaptive k here runs :class:`workbench.rollout.kpolicy.AdaptiveK` (the policy ``drafter.adaptive``
runs) over fixed roofline-shaped costs instead of a run's measured ones: measuring cost curves
takes minutes, and measured step times would make the audit's k choices differ between runs. The
curves are shaped so the policy changes k within one audited batch: the target's step costs
``max(1, tokens in flight / knee)`` (memory-bound below ``knee`` tokens, compute-bound above), with
``knee`` = 1.5 x the batch's rows, so a full batch speculates little and the tail, once rows have
left, speculates more; a draft step costs 5 % of a memory-bound target step. Any choice keeps the
rollouts exact (k_t depends only on earlier steps), which is what the audit then tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.rollout.graphs import capture_sizes
from workbench.rollout.kpolicy import AdaptiveK
from workbench.rollout.workbench_backend import WorkbenchBackend
from workbench.rollout_builder import EngineConfig, workbench_backend

DRAFT_STEP_COST = 0.05  # a draft step's cost, in memory-bound target steps
KNEE_PER_ROW = 1.5  # tokens in flight past which the modeled target is compute-bound, per row of the batch


@dataclass(frozen=True)
class EngineOptions:
    """adaptive: choose k_t per step with AdaptiveK (see module doc); buckets: retire rows only to
    the capture sizes 1, 2, 4, ... (``retire_buckets``); compile: ``torch.compile`` the target's
    (and a draft model's) steps (needs a C++ compiler on the CPU; the first steps compile)."""

    adaptive: bool = False
    buckets: bool = False
    compile: bool = False

    def label(self) -> str:
        on = [name for name in ("adaptive", "buckets", "compile") if getattr(self, name)]
        return "+".join(on) or "plain"


def audit_k_policy(k: int, rows: int) -> AdaptiveK:
    """AdaptiveK over the roofline-shaped costs of the module doc for a batch of ``rows`` rows."""
    knee = KNEE_PER_ROW * max(rows, 1)
    return AdaptiveK(k, lambda tokens: max(1.0, tokens / knee), lambda n, k_t: DRAFT_STEP_COST * k_t, measured=False)


def build_engine(target, drafter, k: int, batch: int, rows: int, options: EngineOptions) -> WorkbenchBackend:
    """The workbench engine (as a rollout backend) for ``drafter`` at ``k``, ``batch`` rows decoded
    together, for a generation of ``rows`` rows (the adaptive costs' knee), with ``options`` on."""
    engine = EngineConfig(
        max_batch_size=batch, retire_buckets=capture_sizes(batch) if options.buckets else None, compile=options.compile
    )
    backend = workbench_backend(target, drafter, k, engine)
    if options.adaptive:
        backend.k_policy = audit_k_policy(k, min(rows, batch))
    return backend
