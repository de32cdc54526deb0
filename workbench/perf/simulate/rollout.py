"""The gen stage of one step: rows on replicas, continuous batching, rows leaving as they finish.

Each of the ``replicas`` generation replicas gets an equal share of the step's prompts × G rows
(shuffled, dealt round-robin). A replica admits queued rows while fewer than ``max_num_seqs`` are in
flight and their KV cache at their *final* length fits (an oracle admission: no preemption); each
admission costs a prefill forward over the prompts, which emits the first token. Every step then
advances each live row (E = 1 token autoregressive; speculative, the tokens N of a verification
step are drawn independently per step with E[N](k) and Var(N) from the per-position acceptance,
docs/design.md §4, so a row of L tokens takes about (L − 1)/E[N] ± sqrt((L − 1)·Var(N)/E[N]³) steps,
:func:`row_steps`: the slowest of many long rows needs more steps than E[N] suggests; with
``speculation.acceptance_vs_context``, :mod:`workbench.perf.simulate.context`; each row's context grows by
its own (L − 1)/steps per step, so it ends at prompt + L), and a row leaves when done, so the
batch shrinks into the long tail (as :mod:`workbench.perf.steps` counts it) and a queued row
takes its place. A step's seconds come from :func:`workbench.perf.simulate.costs.forward_cost` at the
live rows' summed context, which grows by the rows' summed rates per step; between two events (a row leaving)
the rows are fixed and the step time is integrated with Simpson's rule. The gen stage lasts until
the slowest replica is done.

A speculative step is one verification (k + 1 tokens per row) plus k drafter forwards (EAGLE-3 /
MTP: the first over the k + 1 verified positions per row, then k − 1 of 1 token per row,
:func:`draft_s`; the draft layer attends over the same context with its own KV cache;
``ngram`` costs host seconds only: a fixed ``ngram_step_s`` and the scan of every live row's tokens,
:func:`workbench.perf.simulate.costs.ngram_scan_s`), each with its fixed overhead; every step also pays the
sampler's passes over the target's fp32 logits at its B · (k + 1) positions
(:func:`workbench.perf.simulate.costs.sampler_s`, ``gen.sampler_bytes``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from drafters import drafter_class
from workbench.perf.simulate.context import fit_alpha_ref, row_steps_ctx, step_integrals
from workbench.perf.simulate.costs import (
    active_params,
    forward_cost,
    kv_bytes_per_token,
    kv_capacity_tokens,
    ngram_scan_s,
    sampler_s,
    weight_bytes_resident,
)
from workbench.perf.simulate.lengths import MeasuredLengths, grouped_lognormal, read_run_lengths
from workbench.perf.simulate.scenario import ModelShape, Scenario, Speculation
from workbench.rollout.cost import (
    alpha_from_acceptance_length,
    alpha_from_per_position,
    expected_tokens,
    tokens_per_step,
)

# ------------------------------------------------------------------ acceptance


def acceptance_length(spec: Speculation, k: int) -> float:
    """E[N] at k, tokens per verification step (bonus included). ``acceptance_length`` measured at k
    is taken as is; at an unmeasured k, α is fitted at the nearest measured k and E[N] = (1 − α^(k+1)) /
    (1 − α). ``per_position`` rates r_i: 1 + Σ_{i<k} r_i, positions past the list extended with
    α^(i+1), α fitted to the rates. ``alpha``: (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023)."""
    if spec.drafter == "none" or k <= 0:
        return 1.0
    if spec.acceptance_length is not None:
        if k in spec.acceptance_length:
            return float(spec.acceptance_length[k])
        near = min(spec.acceptance_length, key=lambda j: (abs(j - k), j))
        return expected_tokens(alpha_from_acceptance_length(spec.acceptance_length[near], near), k)
    if spec.per_position is not None:
        r = list(spec.per_position[:k])
        a = alpha_from_per_position(spec.per_position)
        r += [a ** (i + 1) for i in range(len(r), k)]
        return tokens_per_step(r)
    return expected_tokens(float(spec.alpha), k)


def acceptance_survival(spec: Speculation, k: int) -> list[float]:
    """P(N ≥ j + 1) for j = 0..k, N the tokens of one verification step (s_0 = 1): α^j for ``alpha``,
    and for a measured ``acceptance_length`` with α fitted to it at k; 1 then the per-position rates
    (extended with α^(i+1)) for ``per_position``. Their sum is E[N] (:func:`acceptance_length`)."""
    if spec.drafter == "none" or k <= 0:
        return [1.0]
    if spec.per_position is not None:
        r = list(spec.per_position[:k])
        a = alpha_from_per_position(spec.per_position)
        return [1.0] + r + [a ** (i + 1) for i in range(len(r), k)]
    a = (
        float(spec.alpha)
        if spec.acceptance_length is None
        else alpha_from_acceptance_length(acceptance_length(spec, k), k)
    )
    return [a**j for j in range(k + 1)]


def tokens_per_step_var(spec: Speculation, k: int) -> float:
    """Var(N) of one verification step, draws independent across steps (docs/design.md §4's model):
    E[N²] = Σ_j (2j + 1) · P(N ≥ j + 1), so Var = Σ_j (2j + 1) s_j − (Σ_j s_j)²; 0 autoregressive."""
    s = acceptance_survival(spec, k)
    return max(sum((2 * j + 1) * x for j, x in enumerate(s)) - sum(s) ** 2, 0.0)


def row_steps(lengths: np.ndarray, mean: float, var: float, k: int, rng: np.random.Generator | None) -> np.ndarray:
    """Verification steps each row of ``lengths`` tokens needs (its first token comes from prefill):
    (L − 1)/E[N] + z · sqrt((L − 1) · Var(N) / E[N]³), z ~ N(0, 1) per row, rounded up — the renewal
    central limit theorem for the steps to cover L − 1 tokens with i.i.d. step sizes N (Ross,
    *Stochastic Processes*, 2nd ed., Thm 3.3.5); bounded by (L − 1)/(k + 1) and L − 1. ``rng`` None or
    Var = 0: ceil((L − 1)/E[N]), the deterministic count."""
    n = np.asarray(lengths, dtype=float) - 1.0
    x = n / mean
    if rng is not None and var > 0:
        x = x + rng.standard_normal(n.size) * np.sqrt(n * var / mean**3)
    return np.clip(np.ceil(x - 1e-9), np.ceil(n / (k + 1) - 1e-9), n)


# ------------------------------------------------------------------ lengths and drafters


def lognormal_lengths(n: int, mean: float, cv: float, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` response lengths (tokens, 1..max_len): lognormal with ``mean`` and coefficient of variation
    ``cv`` (the mean before the cut at ``max_len``; cv = 0: all ``mean``), rounded to whole tokens."""
    if cv == 0:
        x = np.full(n, float(mean))
    else:
        s2 = math.log(1 + cv**2)
        x = rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)
    return np.clip(np.rint(x), 1, max_len).astype(np.int64)


def response_lengths(sc: Scenario) -> np.ndarray:
    """prompts × G response lengths (tokens, 1..max), rows grouped by prompt, seeded by workload.seed:
    lognormal with the given mean, cv and within-prompt icc (:func:`workbench.perf.simulate.lengths.grouped_lognormal`;
    icc = 0 draws :func:`lognormal_lengths`, as before it existed), the given lengths resampled, or a run's
    logged lengths resampled prompt by prompt (:class:`workbench.perf.simulate.lengths.MeasuredLengths`)."""
    w, r = sc.workload, sc.workload.response
    n = w.prompts * w.group_size
    rng = np.random.default_rng(w.seed)
    if r.kind == "lengths":
        src = np.asarray(r.lengths, dtype=float)
        x = rng.permutation(src) if src.size == n else rng.choice(src, size=n)
        return np.clip(np.rint(x), 1, r.max).astype(np.int64)
    if r.kind == "run":
        return run_lengths(tuple(r.run), r.tracking_uri).resample(w.prompts, w.group_size, rng, r.scale_mean, r.max)
    if r.icc > 0:
        return grouped_lognormal(w.prompts, w.group_size, r.mean, r.cv, r.icc, r.max, rng)
    return lognormal_lengths(n, r.mean, r.cv, r.max, rng)


def run_lengths(runs: tuple[str, ...], tracking_uri: str | None) -> MeasuredLengths:
    """The logged lengths of ``runs`` (run ids or names, or sweep/study names: their FINISHED runs) in the
    store ``tracking_uri`` (None: the workbench's), read once per process and store (a scenario is
    simulated many times in a fit or grid).

    Raises:
        ValueError: a name that matches nothing (RunNotFound), or lengths not logged.
    """
    from workbench.tracking import resolve_tracking_uri

    return _run_lengths(tuple(runs), resolve_tracking_uri(tracking_uri))


@functools.lru_cache(maxsize=8)
def _run_lengths(runs: tuple[str, ...], uri: str) -> MeasuredLengths:
    from workbench.runs import RunReader

    reader, ids = RunReader(uri), []
    for name in runs:
        # one run as named (whatever its status), or a sweep's FINISHED runs
        kind, _, named = reader.named(name, histories=False)
        ids += [r.run_id for r in named if kind == "run" or r.status == "FINISHED"]
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValueError(f"workload.response.run={','.join(runs)}: no FINISHED run")
    return read_run_lengths(ids, uri)


def drafter_shape(sc: Scenario) -> ModelShape | None:
    """The drafter's shape: eagle3 / mtp = ``draft_layers`` decoder layers of the target's width with
    an LM head over the draft vocabulary (eagle3: + the fused 3H→H fc; its input embedding is the
    target's); draft_model = ``drafter_model``; ngram / none: no GPU model."""
    s, m = sc.speculation, sc.model
    cls = drafter_class(s.drafter)
    if cls is not None and cls.draft_cost == "model":
        return sc.drafter_model
    if cls is None or cls.draft_cost != "head":
        return None
    vocab = (s.draft_vocab or m.vocab) if cls.reduced_draft_vocab else m.vocab
    base = ModelShape(
        layers=s.draft_layers,
        hidden=m.hidden,
        intermediate=m.intermediate,
        heads=m.heads,
        kv_heads=m.kv_heads,
        head_dim=m.head_dim,
        vocab=vocab,
        tied_embeddings=True,
        bytes_per_param=m.bytes_per_param,
        kv_bytes=m.kv_bytes,
    )
    fc = cls.head_fc_inputs * m.hidden * m.hidden  # eagle3 fc 3H→H; mtp eh_proj 2H→H
    n = active_params(base) + fc
    return base.model_copy(update={"total_params": n, "active_params": n})


def draft_s(
    d: ModelShape, rows: float, context: float, k: int, fwd: Callable[[float, float, float], float], drafter: str
) -> float:
    """Seconds of the drafter's forwards in one step at speculation length k; ``fwd(rows, q, context)``
    one forward of q tokens per row. The forwards are the drafter class's
    (:meth:`workbench.rollout.drafter.Drafter.draft_forwards`): eagle3 / mtp: vLLM's proposer runs its
    first pass over every position the target just verified (k + 1 per row: it needs the draft layer's
    KV and hidden state at each), then k − 1 passes of one token per row
    (``SpecDecodeBaseProposer.propose``: ``for token_index in range(num_speculative_tokens − 1)``,
    vllm/v1/spec_decode); draft_model: k passes of one token."""
    if k <= 0:
        return 0.0
    cls = drafter_class(drafter)
    return sum(n * fwd(rows, q, context) for q, n in cls.draft_forwards(k)) if cls is not None else 0.0


_ALPHA_REF: dict[tuple, float] = {}


def context_alpha_ref(s: Speculation, lengths: np.ndarray, prompt: int) -> float:
    """α at short context under ``acceptance_vs_context``: ``alpha`` as given, or fitted so the stage's mean
    acceptance length at the measured k nearest ``speculation.k`` is the measured one, one α for every k of a
    scan (:func:`workbench.perf.simulate.context.fit_alpha_ref`; memoised: a fit or a grid simulates one stage
    often)."""
    if s.alpha is not None:
        return float(s.alpha)
    assert s.acceptance_length is not None  # the validator allows alpha or acceptance_length here
    km = min(s.acceptance_length, key=lambda j: (abs(j - s.k), j))
    table = s.acceptance_vs_context or {}
    key = (
        tuple(sorted(table.items())),
        s.acceptance_vs_context_k,
        km,
        s.acceptance_length[km],
        prompt,
        hash(np.asarray(lengths).tobytes()),
    )
    if key not in _ALPHA_REF:
        _ALPHA_REF[key] = fit_alpha_ref(
            np.asarray(lengths), prompt, table, s.acceptance_vs_context_k, km, s.acceptance_length[km]
        )
    return _ALPHA_REF[key]


# ------------------------------------------------------------------ one replica


StepFn = Callable[[float, float], float]  # (rows, summed context) -> seconds of one step


def replica_time(
    lengths: np.ndarray,
    prompt: int,
    max_rows: int,
    capacity: float,
    per_step: float | np.ndarray,
    step_s: StepFn,
    prefill_s: Callable[[int], float],
    steps_per_row: np.ndarray | None = None,
) -> tuple[float, float, int]:
    """(seconds, row-steps, steps) of one replica generating ``lengths`` (module doc): continuous
    batching under ``max_rows`` rows and ``capacity`` KV tokens, ``per_step`` tokens per row per step
    (context growth: one rate, or one per row, (N,)); ``steps_per_row`` (default ceil((L − 1) / per_step))
    the steps each row takes.

    Raises:
        ValueError: one row (prompt + its length) does not fit the KV cache.
    """
    queue = [int(x) for x in lengths]
    rates = np.broadcast_to(np.asarray(per_step, dtype=float), (len(queue),))  # (N,) tokens per step of each row
    todo = (
        np.ceil((np.asarray(lengths, dtype=float) - 1) / rates)
        if steps_per_row is None
        else np.asarray(steps_per_row, dtype=float)
    )
    qi, t, row_steps, steps = 0, 0.0, 0.0, 0
    left = np.zeros(0)
    ctx = np.zeros(0)
    need = np.zeros(0)
    rate = np.zeros(0)
    while True:
        reserved = float(need.sum())
        new, q0 = [], qi
        while qi < len(queue) and len(left) + len(new) < max_rows and reserved + prompt + queue[qi] <= capacity:
            reserved += prompt + queue[qi]
            new.append(queue[qi])
            qi += 1
        if new:
            t += prefill_s(len(new))
            arr = np.asarray(new, dtype=float)
            left = np.concatenate([left, todo[q0:qi]])
            ctx = np.concatenate([ctx, np.full(len(new), prompt + 1.0)])
            need = np.concatenate([need, prompt + arr])
            rate = np.concatenate([rate, rates[q0:qi]])
        keep = left > 0
        if not keep.all():
            left, ctx, need, rate = left[keep], ctx[keep], need[keep], rate[keep]
            continue  # freed rows: admit from the queue first
        if left.size == 0:
            if qi < len(queue):
                raise ValueError(
                    f"a row of {prompt + queue[qi]} tokens does not fit the KV cache ({capacity:.0f} tokens per "
                    "replica): use more GPUs per replica (gen.tp) or a shorter response.max"
                )
            return t, row_steps, steps
        n = float(left.min())
        rows = float(left.size)
        c0 = float(ctx.sum())
        c1 = c0 + float(rate.sum()) * (n - 1)
        t += n * (step_s(rows, c0) + 2 * step_s(rows, (c0 + c1) / 2) + step_s(rows, c1)) / 4
        row_steps += n * rows
        steps += int(n)
        left = left - n
        ctx = ctx + rate * n


# ------------------------------------------------------------------ the gen stage


@dataclass
class GenResult:
    """The gen stage of one step on ``replicas`` replicas, one arm (k = 0: autoregressive)."""

    k: int
    seconds: float  # slowest replica
    mean_replica_s: float
    tokens_per_step: float  # E[N]
    replicas: int
    rows_in_flight: float  # mean live rows per step (row-steps / steps) on the slowest replica
    steps: int  # steps of the slowest replica
    max_rows: int


def gen_stage(sc: Scenario, k: int, gpus: int | None = None, lengths: np.ndarray | None = None) -> GenResult:
    """Seconds of the gen stage with speculation length ``k`` (0 = autoregressive) on ``gpus``
    generating GPUs (default: the whole cluster)."""
    m, hw, g, s = sc.model, sc.hardware, sc.gen, sc.speculation
    k = 0 if s.drafter == "none" else k
    gpus = sc.cluster.gpus if gpus is None else gpus
    replicas = max(gpus // g.tp, 1)
    lengths = response_lengths(sc) if lengths is None else lengths
    d = drafter_shape(sc) if k else None
    cap = kv_capacity_tokens(m, hw, g, weight_bytes_resident(d) if d else 0.0, kv_bytes_per_token(d) if d else 0.0)
    max_rows = g.max_num_seqs
    prompt = sc.workload.prompt_len

    def step_s(rows: float, context: float) -> float:
        t = forward_cost(m, hw, g, rows, k + 1, context, g.step_overhead_s).seconds + sampler_s(
            hw, rows * (k + 1), m.vocab, g.sampler_bytes
        )
        if k and d is not None:
            t += draft_s(
                d,
                rows,
                context,
                k,
                lambda r, q, c: forward_cost(d, hw, g, r, q, c, g.draft_overhead).seconds,
                s.drafter,
            )
        elif k:
            t += (
                k * g.draft_overhead
                + s.ngram_step_s
                + ngram_scan_s(context, rows, s.ngram_ns_per_token, s.ngram_threads)
            )
        return t

    def prefill_s(n: int) -> float:
        t = forward_cost(m, hw, g, n, prompt, n * prompt / 2, g.step_overhead_s).seconds + sampler_s(
            hw, n, m.vocab, g.sampler_bytes
        )
        return t + (forward_cost(d, hw, g, n, prompt, n * prompt / 2).seconds if d is not None else 0.0)

    order = np.random.default_rng(sc.workload.seed + 1).permutation(len(lengths))
    rng = np.random.default_rng(sc.workload.seed + 2)
    if k and s.acceptance_vs_context:  # acceptance falling with context (workbench.perf.simulate.context)
        table, kt = s.acceptance_vs_context, s.acceptance_vs_context_k
        grid = step_integrals(context_alpha_ref(s, lengths, prompt), table, kt, k, prompt + int(np.max(lengths)))
        steps = row_steps_ctx(lengths, prompt, grid, k, rng)
        n_tok = np.asarray(lengths, dtype=float) - 1
        E = float(n_tok.sum() / max(float(steps.sum()), 1.0))  # the stage's mean
        per_step = n_tok / np.maximum(steps, 1.0)  # (N,) each row's own rate: a tail row's context grows slower
    else:
        E = acceptance_length(s, k)
        steps = row_steps(lengths, E, tokens_per_step_var(s, k), k, rng)
        per_step = (np.asarray(lengths, dtype=float) - 1) / np.maximum(steps, 1.0) if k else E  # each row's own rate
    times = []
    for r in range(replicas):
        idx = order[r::replicas]
        if idx.size:
            rate = per_step[idx] if isinstance(per_step, np.ndarray) else per_step
            times.append(replica_time(lengths[idx], prompt, max_rows, cap, rate, step_s, prefill_s, steps[idx]))
    slow = max(times, key=lambda x: x[0])
    return GenResult(
        k, slow[0], float(np.mean([x[0] for x in times])), E, replicas, slow[1] / max(slow[2], 1), slow[2], max_rows
    )
