"""Two generations interleaved forward by forward, each timed on its own forwards (docs/design.md §8).

    (spec_out, ar_out), (spec_s, ar_s) = generate_interleaved(
        [backend.generate_steps(prompts, sp, g), twin.generate_steps(prompts, sp, g_ar)], clock, first=0)

The arms are a rollout backend (``workbench.rollout.backend``) and its plain twin, a second
instance of the same backend without a drafter; :func:`paired_metrics` turns a step's two timings
into its paired speedups.

Why per forward: on a shared machine the speed of the CPU (or of a contended GPU) changes within
a fraction of a second. Two plain-decoding runs of the same prompts, back to back, measured
0.87-1.16x of each other on the 2-core CPU (log-ratio sd 0.083 over 14 pairs; 0.017 interleaved;
benchmarks/paired_noise.py). Alternating the
two arms after every batched forward puts both under the same slow and fast moments, so their
ratio keeps the difference in work and loses most of the machine's. The order alternates every
round (A B, B A, A B, ...) and ``first`` says which arm opens, so neither always runs right after
the other. Each arm's time is the sum of its own segments: its forwards, sampling, rejection and
bookkeeping; the driver's own overhead is a few perf_counter calls per forward.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from workbench import metrics as M
from workbench.rollout.counters import SpecCounters


def generate_interleaved(
    arms: Sequence[Generator[None, None, Any]], clock: Callable[[], float], first: int = 0
) -> tuple[list[Any], list[float]]:
    """Advance the ``arms`` (generators from ``RolloutBackend.generate_steps``) one step at a time,
    round-robin, until each returns.

    Args:
        arms: generators that yield after each forward and return their output.
        clock: seconds, monotonic; on CUDA it must synchronise the device (StageTimer.now does), or
            a step's kernels would be billed to whichever arm happens to block next.
        first: index of the arm that takes the first step; the order reverses every round.

    Returns:
        (outputs, seconds): each arm's return value and the summed seconds of its own steps.
    """
    n = len(arms)
    outputs: list[Any] = [None] * n
    seconds = [0.0] * n
    live = list(range(n))
    order = [(first + i) % n for i in range(n)]
    while live:
        for i in order:
            if i not in live:
                continue
            t0 = clock()
            try:
                next(arms[i])
            except StopIteration as stop:
                outputs[i] = stop.value
                live.remove(i)
            seconds[i] += clock() - t0
        order.reverse()
    return outputs, seconds


def paired_metrics(m: dict[str, float], ar: SpecCounters, ar_first: bool) -> dict[str, float]:
    """Per-step paired speedups from the step's timings ``m`` (which hold ``timing_s/gen``,
    ``timing_s/gen_autoregressive`` and ``timing_s/step``, seconds) and the autoregressive arm's counters.

    ``speedup/gen_per_step`` = autoregressive gen s / speculative gen s: a ratio of *stage* times, not
    of time per token, because the stage time is what the step pays (a batch decodes until its longest
    row ends, so time is not proportional to tokens) and both arms sample the same law, so their
    expected work is equal (under keyed sampling the twin decodes the very same completions:
    :func:`twin_divergence`). ``speedup/step_per_step`` = (step - gen - draft_train + gen_ar) / step
    (workbench.stats.step_ratios): the plain step has no speculative generation and trains no drafter,
    so online adaptation's ``timing_s/draft_train`` is charged to speculation. The run's estimates
    ``speedup/gen`` / ``speedup/step`` are computed from these by the run loop
    (workbench.stats.running_speedups).
    """
    gen, ar_s, step = m[M.GEN_S], m[M.GEN_AR_S], m[M.STEP_S]
    plain_step = step - gen - m.get(M.DRAFT_TRAIN_S, 0.0) + ar_s
    return {
        M.SPEEDUP_GEN_PER_STEP: ar_s / max(gen, 1e-9),
        M.SPEEDUP_STEP_PER_STEP: plain_step / max(step, 1e-9),
        M.AR_NUM_TOKENS: float(ar.num_generated_tokens),
        M.AR_NUM_FORWARDS: float(ar.num_verify_steps),
        M.AR_FIRST: float(ar_first),
    }


def twin_divergence(tokens: Sequence[Sequence[int]], twin_tokens: Sequence[Sequence[int]]) -> dict[str, float]:
    """How far the speculative rollouts are from what the plain twin decoded for the same rows.

    Args:
        tokens, twin_tokens: (N, T_i) completion token ids of the two arms, row for row.

    Returns:
        ``gen_autoregressive/differing_tokens``: completion positions whose tokens differ, a position only
        one arm reached counting once; ``gen_autoregressive/differing_rows``: rows with any. Under
        drafter-invariant sampling (``rollout.sampler=keyed``) both are 0 up to float ties between a
        1-token and a (k+1)-token forward; under rejection sampling the arms draw independently.

    Raises:
        ValueError: the arms hold different numbers of rows.
    """
    if len(tokens) != len(twin_tokens):
        raise ValueError(f"twin_divergence: {len(tokens)} rows against the twin's {len(twin_tokens)}")
    per_row = [sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b)) for a, b in zip(tokens, twin_tokens)]
    return {M.AR_DIFFERING_TOKENS: float(sum(per_row)), M.AR_DIFFERING_ROWS: float(sum(n > 0 for n in per_row))}
