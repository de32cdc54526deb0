"""``speedup/gen_modeled``: a deterministic gen speedup from counted forwards and a cost curve.

docs/design.md §8: keep a noise-free estimate beside the measured (paired) speedup, so a reader can
tell noise from effect. Per GRPO step, with cost(T) the seconds of one target forward over T
tokens in flight and drafter(n) the drafter's seconds per verification step at n rows (both
measured once per machine and model, :mod:`workbench.perf.cost_curve`):

- modeled autoregressive gen = Σ over the forwards a plain decode of the *same completions* would
  run of cost(rows): per batch chunk (``rollout.max_batch_size`` rows, in order), at decode step
  t = 1, 2, .. the rows still generating are those with completion length > t (the prefill emits
  each row's first token; a finished row leaves the batch);
- modeled speculative gen = Σ over the speculative arm's counted verification forwards
  (``SpecCounters.rows_per_forward``) of cost(n·(k+1)) + drafter(n);
- ``speedup/gen_modeled`` = modeled autoregressive / modeled speculative.

Both arms sample the target's law (exact speculation), so the same completions stand for both.
Not modelled (equal or small in both arms): the prefill, sampling, rejection sampling and the
engine's bookkeeping, so the modeled speedup is the forwards' share of the measured one. Method:
Leviathan et al. 2023 (arXiv 2211.17192) counted per forward instead of per expected step, with a
measured cost curve instead of a constant verification cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from workbench import metrics as M
from workbench.perf.analytic import CostModel
from workbench.rollout.cost import modeled_step_s


def ar_rows_per_forward(lengths: Sequence[int], chunk: int, continuous: bool = False) -> list[int]:
    """Rows in each decode forward of a plain autoregressive generation of completions of
    ``lengths`` tokens (first token from the prefill), ``chunk`` rows at a time in order, or
    (``continuous``) in ``chunk`` slots that the next rows fill as rows finish."""
    out: list[int] = []
    chunk = max(int(chunk), 1)
    if continuous and len(lengths) > chunk:
        from workbench.perf.steps import slot_schedule

        steps = [max(int(L) - 1, 0) for L in lengths]
        end, starts = slot_schedule(steps, chunk)
        live = [0] * (end + 1)  # +1 at a row's first forward, -1 after its last
        for s, t0 in zip(steps, starts):
            if s:
                live[t0] += 1
                live[t0 + s] -= 1
        n = 0
        for t in range(end):
            n += live[t]
            out.append(n)
        return out
    for i in range(0, len(lengths), chunk):
        part = lengths[i : i + chunk]
        for t in range(1, max(part, default=1)):
            out.append(sum(1 for L in part if L > t))
    return out


def modeled_ar_seconds(
    lengths: Sequence[int], chunk: int, cost: Callable[[float], float], continuous: bool = False
) -> float:
    """Σ cost(rows) over :func:`ar_rows_per_forward` (seconds)."""
    return float(sum(cost(n) for n in ar_rows_per_forward(lengths, chunk, continuous)))


def modeled_spec_seconds(
    rows_per_forward: Sequence[int],
    k: int | Sequence[int],
    cost: Callable[[float], float],
    drafter: Callable[[float, int], float],
) -> float:
    """Σ over verification forwards of cost(n·(k_t+1)) + drafter(n, k_t) (seconds); ``k``: one k for
    every forward, or each forward's k_t (adaptive speculation; k_t = 0: no drafter cost)."""
    ks = [k] * len(rows_per_forward) if isinstance(k, int) else list(k)
    return float(sum(modeled_step_s(n, kt, cost, drafter) for n, kt in zip(rows_per_forward, ks)))


def modeled_metrics(
    lengths: Sequence[int],
    rows_per_forward: Sequence[int],
    k: int | Sequence[int],
    chunk: int,
    cost: Callable[[float], float],
    drafter: Callable[[float, int], float],
    continuous: bool = False,
) -> dict[str, float]:
    """``speedup/gen_modeled``, ``gen/modeled_s`` and ``gen_autoregressive/modeled_s`` of one step."""
    ar = modeled_ar_seconds(lengths, chunk, cost, continuous)
    spec = modeled_spec_seconds(rows_per_forward, k, cost, drafter)
    return {M.SPEEDUP_GEN_MODELED: ar / spec if spec > 0 else 1.0, M.GEN_MODELED_S: spec, M.AR_MODELED_S: ar}


class ModeledSpeedup:
    """The trainer's side: cost curves fixed at construction, :meth:`metrics` per step."""

    def __init__(
        self, target: CostModel, drafter, k: int, chunk: int, info: dict | None = None, continuous: bool = False
    ):
        self.target, self.drafter, self.k, self.chunk, self.continuous = target, drafter, k, chunk, continuous
        self.info = info or {}

    def metrics(self, out) -> dict[str, float]:
        """From a :class:`workbench.rollout.engine.RolloutOutput` of the speculative arm."""
        c = out.counters
        return modeled_metrics(
            [len(t) for t in out.tokens],
            c.rows_per_forward,
            c.k_per_step or self.k,
            self.chunk,
            self.target.time,
            self.drafter.step_at,
            self.continuous,
        )


def build_modeled(spec, target_lm, drafter, prompts: list[list[int]], progress: bool = True) -> ModeledSpeedup | None:
    """Load or measure the target's and the drafter's costs for ``spec`` (None without a drafter, or
    with ``measure.modeled: false`` unless ``drafter.adaptive`` needs them). Call it before the MLflow run opens: a miss
    measures (seconds)."""
    if drafter is None or spec.drafter.kind == "none" or not (spec.measure.modeled or spec.drafter.adaptive):
        return None
    from workbench.perf.cost_curve import drafter_cost, forward_curve

    t0 = time.perf_counter()
    g, r = spec.grpo, spec.rollout
    chunk = max(1, min(g.prompts_per_step * g.group_size, r.max_batch_size))
    k = spec.drafter.k
    mean_prompt = sum(map(len, prompts)) / max(len(prompts), 1)
    ctx = int(-(-(mean_prompt + r.max_new_tokens // 2) // 16) * 16)  # a typical context, rounded up to 16
    target, hit_t = forward_curve(target_lm, chunk, max(8, k + 1), ctx, f"target ({spec.model.target})", progress)
    dcost, hit_d = drafter_cost(spec, target_lm, drafter, prompts, chunk, ctx, progress)
    info = {"seconds": time.perf_counter() - t0, "cached": hit_t and hit_d, "drafter_cost": dcost.how}
    return ModeledSpeedup(target, dcost, k, chunk, info, continuous=r.continuous_batching)
