"""Checking the model on a measured sweep (``wb project --sweep NAME``: :func:`check_sweep`, one point:
:func:`predict_point`). For
every point the gen stage is predicted from quantities that are *not* the point's gen time, and
compared with the point's measured step speedup over the sweep's ``drafter=none`` baseline:

- Acceptance (the point's own counters): tokens per verification step of a drafted row
  E[N] = 1 + Σ_i r_i with r_i = ``spec/acceptance_rate_pos_<i>`` (used directly, no geometric α;
  it equals ``spec/acceptance_length``). The per-position rates also give the distribution of the
  tokens one step emits, P(emit ≥ i+2) = r_i (accepts are a prefix). Rows an n-gram drafter has no
  draft for emit one token; their share is ``tokens − rows − num_drafts·E[N]`` row-steps
  (``gen/num_tokens``, ``spec/num_drafts``; the prefill emits each row's first token; EOS cutting
  an accepted run short is ignored, so the share is a slight underestimate).
- Work: row-steps R (one row in one verification step) = ``spec/num_drafts`` + the undrafted
  row-steps; for the baseline R = tokens − rows (one token per row per step). Verification steps
  S (batched target forwards) are *not* logged, and rows leave the batch as they finish (EOS), so
  S depends on the completion-length distribution: S = E[max over rows of each row's steps],
  simulated (fixed-seed Monte Carlo) from completion lengths sampled by the target itself on the
  sweep's task prompts (one batch shape as in the run: prompts_per_step × group_size rows in
  chunks of max_batch_size) and the point's emit distribution. Assumption: the lengths of the
  initial target stand for every GRPO step's (the policy moves little in a short run).
- Cost (a microbenchmark of the rollout engine, not of the point's run,
  :mod:`workbench.perf.microbench`): for the baseline and for every drafter × k, one engine step (target verification forward over n × (k+1) tokens, drafter
  passes, sampling and rejection sampling, bookkeeping) is timed at n = 1 .. batch rows kept
  constant (EOS ignored, m1 and m2 new tokens, seconds per step = Δtime / Δsteps, the fastest of
  ``reps`` identical runs), and fitted as a + b·n (per-step overhead + per-row cost); the
  remainder at the full batch is the per-batch cost P (prefill, first token, retiring rows). So
  gen(model) = chunks·P + a·S + b·R. Assumptions: step cost is affine in the rows in flight and
  does not depend on which tokens are drafted; the context length is that of a typical row.
- Prediction: gen' = measured baseline gen × gen(model, point) / gen(model, baseline) — the
  microbenchmark fixes the ratio, the baseline's measurement the level (machine load differs
  between the sweep and the microbenchmark). Only gen changes with speculation, so the point's own
  measured non-gen stages are kept: step' = (point step − point gen) + gen', predicted step
  speedup = baseline step / step'. The microbenchmark must run under the sweep's conditions (same
  device, same torch thread count: ``--threads``); runs do not log their thread count.
- Machine speed: speculation leaves the non-gen stages alone, so the point's non-gen seconds over
  the baseline's (``non-gen ×``) measures how much faster or slower the machine ran during the
  point (on shared CPUs: other jobs). It is shown, and with ``--load-adjust`` gen' is multiplied by
  it (assumption: load slows gen and the other stages alike); off by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.perf.steps import StepCost, batch_steps, emit_pmf, tokens_per_step
from workbench.perf.sweep_runs import SweepRun, baseline_for, config_key, load_sweep, missing_metrics, workload_key


@dataclass
class PointPrediction:
    """Measured vs predicted for one sweep point (seconds are means per GRPO step)."""

    run: SweepRun
    base: SweepRun
    tokens_per_step: float  # E[N] = 1 + Σ r_i (drafted rows)
    no_draft: float  # share of row-steps without a draft
    steps: float  # S, verification steps per GRPO step (simulated)
    row_steps: float  # R, from the counters
    base_steps: float
    base_row_steps: float
    step_cost_ratio: float  # one step at the mean rows in flight / one autoregressive step at the baseline's
    model_gen: float  # the microbenchmark's gen seconds, point
    model_gen_base: float  # ... and baseline
    gen_pred: float
    step_pred: float
    speedup_meas: float
    speedup_pred: float

    @property
    def gen_meas(self) -> float:
        return self.run.gen

    @property
    def non_gen_ratio(self) -> float:
        """Point's non-gen seconds / baseline's: speculation leaves them unchanged, so a ratio far
        from 1 says the machine ran at another speed during one of the runs (load, thermal)."""
        return (self.run.step - self.run.gen) / (self.base.step - self.base.gen)

    @property
    def error(self) -> float:
        """Relative error of the predicted step speedup: predicted / measured − 1."""
        return self.speedup_pred / self.speedup_meas - 1.0

    def within(self, tol: float) -> bool:
        return abs(self.error) <= tol


def row_steps_of(run: SweepRun) -> tuple[float, float]:
    """(row-steps R, share of them without a draft) from the run's counters (see the module doc)."""
    emitted = run.means["gen/num_tokens"] - run.rows  # the prefill emits each row's first token
    if run.is_baseline:
        return emitted, 1.0
    drafts = run.means.get("spec/num_drafts", 0.0)
    undrafted = max(0.0, emitted - drafts * tokens_per_step(run.per_pos))
    total = drafts + undrafted
    return total, (undrafted / total if total else 0.0)


def predict_point(run: SweepRun, base: SweepRun, cost: StepCost, base_cost: StepCost, lengths: list[list[int]],
                  reps: int = 64, seed: int = 0, load_adjust: bool = False) -> PointPrediction:
    """The point's gen and step speedup from the baseline's measured stage times, the point's
    acceptance counters and non-gen stage times, measured step costs and sampled lengths.

    ``load_adjust``: also scale the predicted gen by the point's non-gen seconds / the baseline's
    (:attr:`PointPrediction.non_gen_ratio`), assuming a slower or faster machine during the point
    (shared cores, thermal) changed its gen stage in the same proportion as the stages speculation
    does not touch. Off by default: it is a correction for the measurement, not part of the model."""
    R0, _ = row_steps_of(base)
    S0, _ = batch_steps(lengths, base.chunk, [1.0], reps, seed, base.continuous)
    R, f0 = row_steps_of(run)
    S, _ = batch_steps(lengths, run.chunk, emit_pmf(run.per_pos, f0), reps, seed, run.continuous)
    g0 = base_cost.gen_time(base.chunks, S0, R0)
    g1 = cost.gen_time(run.chunks, S, R)
    gen_pred = base.gen * g1 / g0
    if load_adjust:
        gen_pred *= (run.step - run.gen) / (base.step - base.gen)
    step_pred = (run.step - run.gen) + gen_pred
    ratio = cost.step(R / S if S else 0.0) / base_cost.step(R0 / S0 if S0 else 0.0)
    return PointPrediction(run, base, tokens_per_step(run.per_pos), f0, S, R, S0, R0, ratio, g1, g0, gen_pred, step_pred,
                           base.step / run.step, base.step / step_pred)


# ------------------------------------------------------------------ the whole check (wb project --sweep)


@dataclass
class SweepCheck:
    """``wb project --sweep``'s result: what was predicted from what, and what was not checked."""

    sweep: str
    uri: str  # the MLflow store read
    pairs: list[tuple[SweepRun, SweepRun]]  # (point, its baseline), points with every metric needed
    step_costs: dict[str, StepCost]  # per config_key
    lengths: dict[str, list[list[int]]]  # completion lengths per workload_key, one list per batch
    source: str  # where the step costs came from (microbenchmark or --costs file)
    predictions: list[PointPrediction]
    skipped: list[str] = field(default_factory=list)  # "label: why" per point not checked

    def config_keys(self) -> list[str]:
        """The configurations of the checked pairs that have a step cost, baseline first per pair, once each."""
        keys = dict.fromkeys(k for r, b in self.pairs for k in (config_key(b.params), config_key(r.params)))
        return [k for k in keys if k in self.step_costs]

    def within(self, tolerance: float) -> int:
        """How many points' predicted step speedups are within ``tolerance`` (relative) of the measured."""
        return sum(p.within(tolerance) for p in self.predictions)


def find_pairs(runs: list[SweepRun]) -> tuple[list[tuple[SweepRun, SweepRun]], list[str]]:
    """(point, baseline) per FINISHED speculative run that has a FINISHED baseline of its setting
    and every metric a prediction needs; the others as "label: why"."""
    finished = [r for r in runs if r.status == "FINISHED"]
    skipped = [f"{r.label()}: {r.status.lower()}" for r in runs if r.status != "FINISHED"]
    pairs = []
    for r in finished:
        if r.is_baseline:
            continue
        b = baseline_for(r, finished)
        miss = missing_metrics(r) + (missing_metrics(b) if b else [])
        if b is None:
            skipped.append(f"{r.label()}: no finished drafter=none baseline with the same settings")
        elif miss:
            skipped.append(f"{r.label()}: no " + ", ".join(miss))
        else:
            pairs.append((r, b))
    return pairs, skipped


def predict_pairs(pairs: list[tuple[SweepRun, SweepRun]], step_costs: dict[str, StepCost], lengths: dict[str, list[list[int]]],
                  load_adjust: bool = False) -> tuple[list[PointPrediction], list[str]]:
    """:func:`predict_point` per pair that has its step costs and lengths; the others as "label: why"."""
    preds, skipped = [], []
    for r, b in pairs:
        ck, bk, wk = config_key(r.params), config_key(b.params), workload_key(b.params)
        missing = next((key for key, have in ((ck, step_costs), (bk, step_costs), (wk, lengths)) if key not in have), None)
        if missing is not None:
            skipped.append(f"{r.label()}: no step cost / lengths for {missing!r}")
            continue
        preds.append(predict_point(r, b, step_costs[ck], step_costs[bk], lengths[wk], load_adjust=load_adjust))
    return preds, skipped


def check_sweep(name: str, tracking_uri: str | None = None, costs: str | None = None, save_costs: str | None = None,
                threads: int | None = None, reps: int = 3, load_adjust: bool = False,
                progress: Callable[[str], None] = lambda s: None) -> SweepCheck:
    """Predict every point of sweep ``name`` and pair it with its measurement (see the module doc).

    Step costs and lengths come from ``costs`` (a ``--save-costs`` JSON) or, without it, from the
    engine microbenchmark run now (``threads`` torch threads, ``reps`` rounds; written to
    ``save_costs`` when given).

    Raises:
        ValueError: no such sweep, no point with a baseline to check, or an unreadable ``costs`` file
        (the message is meant for the user).
    """
    from workbench.perf.microbench import load_costs, measure
    from workbench.perf.microbench import save_costs as write_costs

    runs, uri = load_sweep(name, tracking_uri)
    pairs, skipped = find_pairs(runs)
    if not pairs:
        raise ValueError(f"sweep {name!r}: no point with a baseline to check" + (" (" + "; ".join(skipped) + ")" if skipped else ""))
    if costs:
        try:
            step_costs, lengths, meta = load_costs(costs)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"--costs: {e}") from None
        source = f"--costs {costs}" + (f" (measured {meta.get('date', '?')}, {meta.get('threads', '?')} threads)" if meta else "")
    else:
        step_costs, lengths, meta = measure(pairs, threads, reps, progress)
        source = f"engine microbenchmark, torch {meta['threads']} thread(s), fastest of {reps}"
        if save_costs:
            write_costs(save_costs, step_costs, lengths, meta)
    preds, more = predict_pairs(pairs, step_costs, lengths, load_adjust)
    return SweepCheck(name, uri, pairs, step_costs, lengths, source, preds, skipped + more)
