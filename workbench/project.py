"""`wb project`: a performance model of a synchronous and an asynchronous GRPO step with speculation.

Pure functions; every assumption is named here.

Generation (Leviathan et al. 2023, DESIGN.md §4, independence assumption): with per-token
acceptance α and k drafts per verification, tokens per verification step
E[N] = (1 − α^(k+1)) / (1 − α). One verification costs ``verify_ratio(k)`` target decode steps
and k drafter steps cost k·c, so the gen speedup is S = E[N] / (k·c + verify_ratio(k)).
verify_ratio(k) = T(B·(k+1)) / T(B): the target's forward time with B rows × (k+1) tokens in flight
over its time with B tokens (one decode step). It is 1 while the forward is memory-bound and grows
~(k+1) once compute-bound. T comes from a :class:`CostModel`: constant (memory-bound), a measured
curve (tokens in flight -> seconds, interpolated), or a roofline
T(tokens) = max(2·params·tokens / FLOP/s, weight_bytes / bandwidth) (KV-cache traffic ignored).

Step (synchronous, DESIGN.md §3): only the gen stage changes, so
step' = step − gen + gen / S and the step speedup is step / step'.

Asynchronous (one-step or s-step off-policy): generation of step t+1.. runs concurrently with the
train side (everything but gen: data, prepare, logprob, train, draft_train) of step t on separate
resources. Generator and trainer form a two-stage pipeline; the generator may run at most s steps
ahead of the policy version it samples from (staleness s). Deterministic stage times give
step ≈ max(gen, train_side) for every s ≥ 1 (instead of the sum). With per-step variation of the
gen time (coefficient of variation ``cv``, lognormal), a larger s lets slack absorb slow steps and
the mean step time falls from E[max(gen_t, train)] (s = 1) towards max(E[gen], train) (s → ∞);
:func:`async_step_time` simulates the max-plus recursion with common random numbers, so it is
non-increasing in s. Speculation helps an async step only while gen is the longer stage.

Acceptance: α from per-position acceptance rates r_i ≈ α^(i+1) (least squares in log space), or
from the mean acceptance length at k by inverting E[N].

Checking the model on a measured sweep (``wb project --sweep NAME``, :func:`predict_point`). For
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
- Cost (a microbenchmark of the rollout engine, not of the point's run): for the baseline and for
  every drafter × k, one engine step (target verification forward over n × (k+1) tokens, drafter
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

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STAGES = ("data", "prepare", "gen", "logprob", "train", "draft_train")


# ------------------------------------------------------------------ acceptance


def expected_tokens(alpha: float, k: int) -> float:
    """E[N] = (1 − α^(k+1)) / (1 − α): tokens per verification step (bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_per_position(rates: list[float]) -> float:
    """α fitting r_i ≈ α^(i+1): log α = Σ (i+1) log r_i / Σ (i+1)^2 (zero rates are skipped)."""
    pts = [(i + 1, math.log(r)) for i, r in enumerate(rates) if r > 0]
    if not pts:
        return 0.0
    return min(math.exp(sum(w * lr for w, lr in pts) / sum(w * w for w, _ in pts)), 1.0)


def alpha_from_acceptance_length(length: float, k: int) -> float:
    """α with E[N](α, k) = ``length`` (bisection; length in [1, k+1])."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


# ------------------------------------------------------------------ cost of a target forward


@dataclass
class CostModel:
    """Target forward time as a function of tokens in flight.

    kind "constant": always memory-bound (verify_ratio = 1). "curve": measured points
    (tokens, seconds), linear interpolation, linear extrapolation past the last two points.
    "roofline": max(2·params·tokens / flops, params·bytes_per_param / bandwidth).
    """

    kind: str = "constant"
    tokens: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    params: float = 0.0
    bytes_per_param: float = 2.0
    flops: float = 0.0  # FLOP/s
    bandwidth: float = 0.0  # bytes/s

    def time(self, tokens: float) -> float:
        if self.kind == "roofline":
            return roofline_time(self.params, tokens, self.flops, self.bandwidth, self.bytes_per_param)
        if self.kind == "curve":
            x, y = self.tokens, self.seconds
            if tokens <= x[-1]:
                return float(np.interp(tokens, x, y))
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if len(x) > 1 else 0.0
            return y[-1] + slope * (tokens - x[-1])
        return 1.0

    def verify_ratio(self, k: int, batch: int) -> float:
        """T(batch·(k+1)) / T(batch): one verification in units of one decode step."""
        return self.time(batch * (k + 1)) / self.time(batch)


def roofline_time(params: float, tokens: float, flops: float, bandwidth: float, bytes_per_param: float = 2.0) -> float:
    """Seconds for one forward over ``tokens`` tokens: max(compute 2·params·tokens/flops, weights bytes/bandwidth)."""
    return max(2.0 * params * tokens / flops, params * bytes_per_param / bandwidth)


def load_cost_curve(path: str | Path) -> CostModel:
    """A measured curve from JSON ({"tokens": [...], "seconds": [...]} or [[tokens, seconds], ...]) or
    CSV (columns tokens, seconds; a header row is optional)."""
    p = Path(path)
    text = p.read_text()
    if p.suffix.lower() == ".json":
        d = json.loads(text)
        pts = list(zip(d["tokens"], d["seconds"])) if isinstance(d, dict) else [tuple(r) for r in d]
    else:
        pts = []
        for row in csv.reader(text.splitlines()):
            try:
                pts.append((float(row[0]), float(row[1])))
            except (ValueError, IndexError):
                continue  # header or blank
    if not pts:
        raise ValueError(f"cost curve {path}: no (tokens, seconds) points")
    pts.sort()
    return CostModel("curve", [float(a) for a, _ in pts], [float(b) for _, b in pts])


# ------------------------------------------------------------------ speedups


def gen_speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """S = E[N] / (k·c + verify_ratio)."""
    return expected_tokens(alpha, k) / (k * c + verify_ratio)


def step_speedup(step: float, gen: float, s_gen: float) -> float:
    """step / (step − gen + gen / S): only the gen stage gets faster."""
    return step / (step - gen + gen / s_gen)


def async_step_time(gen: float, train_side: float, staleness: int, cv: float = 0.0, steps: int = 4000, seed: int = 0) -> float:
    """Mean step time of the two-stage pipeline (generator, trainer) with bounded staleness.

    staleness 0 = synchronous (gen + train_side). For s ≥ 1, with G_t / R_t the finish times of
    gen and train of step t: G_t = max(G_{t−1}, R_{t−1−s}) + g_t (the generator needs the policy
    that is at most s steps old), R_t = max(R_{t−1}, G_t) + train_side. g_t is lognormal with mean
    ``gen`` and coefficient of variation ``cv`` (cv = 0: constant -> max(gen, train_side)).
    """
    rng = np.random.default_rng(seed)
    if cv > 0:
        sig2 = math.log(1 + cv * cv)
        g = np.exp(rng.normal(-sig2 / 2, math.sqrt(sig2), steps))
        g *= gen / g.mean()  # exact mean, so staleness 0 is the synchronous step
    else:
        g = np.full(steps, float(gen))
    if staleness <= 0:
        return float(g.mean() + train_side)
    G = np.zeros(steps)
    R = np.zeros(steps)
    for t in range(steps):
        need = R[t - 1 - staleness] if t - 1 - staleness >= 0 else 0.0
        G[t] = max(G[t - 1] if t else 0.0, need) + g[t]
        R[t] = max(R[t - 1] if t else 0.0, G[t]) + train_side
    return float(R[-1] / steps)


@dataclass
class Projection:
    drafter: str
    k: int
    alpha: float
    c: float
    expected_tokens: float
    verify_ratio: float
    gen_speedup: float
    gen_s: float
    step_s: float
    step_speedup: float


def project(stages: dict[str, float], alphas: dict[str, float], cs: dict[str, float], ks: list[int],
            cost: CostModel | None = None, batch: int = 256) -> list[Projection]:
    """Projected gen and synchronous step speedups per drafter × k from mean stage times (seconds).

    stages: ``gen`` plus any other stages; their sum is the step (pass ``other`` for time not
    covered by a stage).
    """
    cost = cost or CostModel()
    step = sum(stages.values())
    gen = stages["gen"]
    out = []
    for d, a in alphas.items():
        for k in ks:
            vr = cost.verify_ratio(k, batch)
            s = gen_speedup(a, k, cs[d], vr)
            out.append(Projection(d, k, a, cs[d], expected_tokens(a, k), vr, s, gen / s, step - gen + gen / s, step_speedup(step, gen, s)))
    return out


def best_k(rows: list[Projection]) -> dict[str, Projection]:
    best: dict[str, Projection] = {}
    for r in rows:
        if r.drafter not in best or r.gen_speedup > best[r.drafter].gen_speedup:
            best[r.drafter] = r
    return best


# ------------------------------------------------------------------ the published seeds (DESIGN.md §6)

SEEDS = {
    # name: (gen before s, gen after s, published step speedup, published gen speedup)
    "RL-Zero": (100.0, 56.6, 1.41, 1.8),
    "RL-Think": (133.6, 87.0, 1.35, 1.54),
}
GEN_FRACTION_RANGE = (0.65, 0.72)  # §6: generation is 65–72 % of a synchronous step


def back_out_non_gen(gen: float, gen_spec: float, step_speedup_pub: float) -> float:
    """Non-gen seconds x with (gen + x) / (gen_spec + x) = published step speedup."""
    return (gen - step_speedup_pub * gen_spec) / (step_speedup_pub - 1.0)


def seeds_check() -> list[dict]:
    """For each seed: the non-gen time backed out of the published numbers, the gen fraction it
    implies, and the step speedup the model projects (a) from those stage times and gen times and
    (b) from the nearest gen fraction inside §6's 65–72 % range."""
    rows = []
    for name, (g0, g1, pub, pub_gen) in SEEDS.items():
        other = back_out_non_gen(g0, g1, pub)
        frac = g0 / (g0 + other)
        f_range = min(max(frac, GEN_FRACTION_RANGE[0]), GEN_FRACTION_RANGE[1])
        s = g0 / g1
        proj = step_speedup(g0 + other, g0, s)
        other_range = g0 * (1 - f_range) / f_range
        proj_range = step_speedup(g0 + other_range, g0, s)
        rows.append(dict(seed=name, gen_s=g0, gen_spec_s=g1, gen_speedup=s, published_gen_speedup=pub_gen,
                         non_gen_s=other, gen_fraction=frac, step_speedup=proj, published=pub,
                         gen_fraction_in_range=f_range, step_speedup_in_range=proj_range,
                         ok=abs(proj - pub) <= 0.02 and abs(proj_range - pub) <= 0.02))
    return rows


# ------------------------------------------------------------------ MLflow input


def stages_from_mlflow(run: str, tracking_uri: str | None = None, skip_first: bool = True) -> tuple[dict[str, float], dict]:
    """Mean ``timing_s/<stage>`` and the acceptance information of an MLflow run given by id or run
    name, read by :class:`workbench.runs.RunReader`. Means are :meth:`workbench.runs.RunRecord.mean`
    (the run's ``measure.warmup_steps`` left out); ``skip_first=False`` keeps every step.

    Returns (stages, info) with info keys ``drafter``, ``k``, ``per_pos`` (list of rates),
    ``acceptance_length``. ``other`` holds ``timing_s/other`` when logged.
    """
    from workbench.runs import RunNotFound, RunReader

    try:
        r = RunReader(tracking_uri).get(run)
    except RunNotFound as e:
        raise ValueError(f"--run: {e}") from None

    def mean(key: str) -> float | None:
        if skip_first:
            return r.mean(key)
        vals = r.series(key, warmup=False)
        return sum(vals) / len(vals) if vals else None

    stages = {}
    for st in STAGES + ("reward", "other"):
        v = mean(f"timing_s/{st}")
        if v is not None:
            stages[st] = v
    if "gen" not in stages:
        raise ValueError(f"--run {run}: no timing_s/gen metric")
    k = int(r.params.get("drafter.k", 0) or 0)
    per_pos = [mean(f"spec/acceptance_rate_pos_{i}") for i in range(k)]
    info = dict(drafter=r.params.get("drafter.kind", "drafter"), k=k,
                per_pos=[p for p in per_pos if p is not None], acceptance_length=mean("spec/acceptance_length"))
    return stages, info


# ------------------------------------------------------------------ a measured sweep (wb project --sweep)

POS_KEY = "spec/acceptance_rate_pos_"


def tokens_per_step(per_pos: list[float]) -> float:
    """E[N] = 1 + Σ_i r_i: expected tokens one verification step emits for a drafted row (bonus or
    correction token included), from per-position acceptance rates r_i = P(draft position i accepted)."""
    return 1.0 + float(sum(per_pos))


def emit_pmf(per_pos: list[float], no_draft: float = 0.0) -> np.ndarray:
    """P(one verification step emits j+1 tokens), j = 0..k, from per-position rates (accepts form a
    prefix, so P(accepted ≥ i+1) = r_i) and the share of row-steps without a draft (they emit 1)."""
    r = np.minimum.accumulate(np.clip(np.asarray(per_pos, dtype=float), 0.0, 1.0)) if len(per_pos) else np.zeros(0)
    ge = np.concatenate([[1.0], r, [0.0]])  # P(accepted >= j), j = 0..k+1
    p = (ge[:-1] - ge[1:]) * (1.0 - no_draft)
    p[0] += no_draft
    return p / p.sum()


def simulate_steps(lengths: list[int], pmf: np.ndarray | list[float], reps: int = 64, seed: int = 0) -> tuple[float, float]:
    """(verification steps S, row-steps R) of one batch whose rows generate ``lengths`` tokens.

    The prefill emits each row's first token; a row then takes steps, each emitting j+1 tokens with
    probability pmf[j], until it has its length; finished rows leave the batch, so the batch runs
    for S = max over rows of the row's steps. Means over ``reps`` fixed-seed draws (pmf = [1]: the
    autoregressive S = max(L) − 1, R = Σ (L − 1), exactly).
    """
    rem = np.asarray(lengths, dtype=np.int64) - 1
    rem = rem[rem > 0]
    if rem.size == 0:
        return 0.0, 0.0
    pmf = np.asarray(pmf, dtype=float)
    if pmf.size == 1 or pmf[0] >= 1.0:
        return float(rem.max()), float(rem.sum())
    T = int(rem.max())
    reps = max(4, min(reps, 4_000_000 // (rem.size * T)))
    rng = np.random.default_rng(seed)
    emits = rng.choice(pmf.size, size=(reps, rem.size, T), p=pmf / pmf.sum()) + 1
    steps = (emits.cumsum(-1) < rem[None, :, None]).sum(-1) + 1  # draws until the row has its length
    return float(steps.max(1).mean()), float(steps.sum(1).mean())


def batch_steps(batches: list[list[int]], chunk: int, pmf, reps: int = 64, seed: int = 0) -> tuple[float, float]:
    """Mean (S, R) per GRPO step over sampled batches; a batch larger than ``chunk`` rows
    (rollout.max_batch_size) runs as consecutive chunks, whose S and R add up."""
    out = []
    for b in batches:
        parts = [simulate_steps(b[i : i + chunk], pmf, reps, seed + i) for i in range(0, len(b), max(chunk, 1))]
        out.append((sum(p[0] for p in parts), sum(p[1] for p in parts)))
    return float(np.mean([o[0] for o in out])), float(np.mean([o[1] for o in out]))


def fit_affine(ns: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares a + b·n through (n, seconds), with a, b ≥ 0 (a noisy fit is clipped, the other refitted)."""
    x, y = np.asarray(ns, dtype=float), np.asarray(seconds, dtype=float)
    if x.size == 1 or np.ptp(x) == 0:
        return float(max(y.mean(), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if a < 0:
        return 0.0, float(max((x * y).sum() / (x * x).sum(), 0.0))
    if b < 0:
        return float(max(y.mean(), 0.0)), 0.0
    return float(a), float(b)


@dataclass
class StepCost:
    """Measured cost of the rollout engine at one configuration (target, drafter, k).

    One step with n rows in flight: ``a + b·n`` seconds; ``prefill``: per-batch seconds (prefill,
    first token, retiring rows). ``grid``: the measured seconds per step at each n.
    """

    prefill: float
    a: float
    b: float
    grid: dict[int, float] = field(default_factory=dict)

    def step(self, n: float) -> float:
        return self.a + self.b * n

    def gen_time(self, chunks: int, steps: float, row_steps: float) -> float:
        """chunks·P + a·S + b·R: a GRPO step's gen seconds with S verification steps and R row-steps."""
        return chunks * self.prefill + self.a * steps + self.b * row_steps

    def to_json(self) -> dict:
        return {"prefill_s": self.prefill, "a_s": self.a, "b_s": self.b, "grid_s": {str(n): v for n, v in self.grid.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "StepCost":
        return cls(float(d["prefill_s"]), float(d["a_s"]), float(d["b_s"]), {int(n): float(v) for n, v in d.get("grid_s", {}).items()})


@dataclass
class SweepRun:
    """One child run of a sweep: params, means after warm-up of its metrics (workbench.runs.RunRecord.mean)."""

    run_id: str
    name: str
    status: str
    params: dict[str, str]
    means: dict[str, float]

    @property
    def kind(self) -> str:
        return self.params.get("drafter.kind", "none")

    @property
    def is_baseline(self) -> bool:
        return self.kind == "none"

    @property
    def k(self) -> int:
        return 0 if self.is_baseline else int(self.params.get("drafter.k", 0) or 0)

    def _int(self, key: str, default: int) -> int:
        try:
            return int(self.params.get(key, default))
        except (TypeError, ValueError):
            return default

    @property
    def rows(self) -> int:
        """Rollouts per GRPO step: prompts_per_step × group_size."""
        return self._int("grpo.prompts_per_step", 8) * self._int("grpo.group_size", 8)

    @property
    def chunk(self) -> int:
        return min(self.rows, self._int("rollout.max_batch_size", 256))

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk)

    @property
    def per_pos(self) -> list[float]:
        return [self.means[f"{POS_KEY}{i}"] for i in range(self.k) if f"{POS_KEY}{i}" in self.means]

    @property
    def gen(self) -> float | None:
        return self.means.get("timing_s/gen")

    @property
    def step(self) -> float | None:
        return self.means.get("timing_s/step")

    def label(self) -> str:
        return "baseline (none)" if self.is_baseline else f"{self.kind} k={self.k}"


def config_key(params: dict[str, str]) -> str:
    """What the engine microbenchmark measures for a run: target (+ dtype, device), drafter kind,
    its model or n-gram window, k. ``tiny none`` / ``tiny draft_model(tiny-draft) k=3`` / ``tiny ngram(1..4) k=3``."""
    tgt = params.get("model.target", "?")
    extra = [v for key, v in (("model.dtype", "float32"), ("model.device", "auto")) if params.get(key, v) != v]
    head = " ".join([tgt, *extra])
    kind = params.get("drafter.kind", "none")
    if kind == "none":
        return f"{head} none"
    detail = {"draft_model": f"({params.get('drafter.model', '?')})",
              "ngram": f"({params.get('drafter.prompt_lookup_min', '?')}..{params.get('drafter.prompt_lookup_max', '?')})"}.get(kind, "")
    return f"{head} {kind}{detail} k={params.get('drafter.k', '?')}"


WORKLOAD_KEYS = ("model.target", "task.name", "task.path", "rollout.temperature", "rollout.top_p", "rollout.top_k",
                 "rollout.max_new_tokens", "grpo.prompts_per_step", "grpo.group_size", "seed")


def workload_key(params: dict[str, str]) -> str:
    """What the completion lengths depend on: target, task, sampling, batch shape."""
    return " ".join(f"{key.split('.')[-1]}={params.get(key, '-')}" for key in WORKLOAD_KEYS)


def baseline_for(run: SweepRun, runs: list[SweepRun]) -> SweepRun | None:
    """The autoregressive baseline of ``run`` by the one rule of :func:`workbench.runs.baseline_for`:
    FINISHED, ``drafter.kind=none``, identical params except ``drafter.*``, ``tracking.*``,
    ``measure.*`` and ``name``; None when the sweep has none of that setting."""
    from workbench.runs import baseline_for as _baseline_for

    return _baseline_for(run, runs)


def load_sweep(name: str, tracking_uri: str | None = None) -> tuple[list[SweepRun], str]:
    """The child runs of sweep ``name`` (newest parent tagged ``workbench.sweep`` = name), read by
    :class:`workbench.runs.RunReader` (one run per point: a resumed point's FINISHED run wins), with
    the means after warm-up (:meth:`workbench.runs.RunRecord.mean`) of their ``timing_s/*``,
    ``gen/num_tokens`` and ``spec/*`` metrics. Returns (runs, tracking URI).

    Raises:
        ValueError: no such sweep (the message lists the sweeps in the store).
    """
    from workbench.runs import RunReader

    reader = RunReader(tracking_uri)
    parent = reader.find_parent("workbench.sweep", name, "workbench.sweep.role")
    if parent is None:
        parents = reader.top_level("tags.`workbench.sweep.role` = 'parent'")
        names = list(dict.fromkeys(p.data.tags.get("workbench.sweep", "") for p in parents))
        raise ValueError(f"--sweep: no sweep named {name!r} in {reader.uri}; sweeps there: {', '.join(n for n in names if n) or '(none)'}"
                         " (set the store with --tracking-uri or $MLFLOW_TRACKING_URI)")
    runs = []
    for r in reader.children(parent.info.run_id, [parent.info.experiment_id]):
        keys = [key for key in r.history if key.startswith(("timing_s/", "spec/", "gen/num_tokens"))]
        means = {key: m for key in keys if (m := r.mean(key)) is not None}
        runs.append(SweepRun(r.run_id, r.name, r.status, dict(r.params), means))
    runs.sort(key=lambda x: (not x.is_baseline, x.kind, x.k))
    return runs, reader.uri


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
    S0, _ = batch_steps(lengths, base.chunk, [1.0], reps, seed)
    R, f0 = row_steps_of(run)
    S, _ = batch_steps(lengths, run.chunk, emit_pmf(run.per_pos, f0), reps, seed)
    g0 = base_cost.gen_time(base.chunks, S0, R0)
    g1 = cost.gen_time(run.chunks, S, R)
    gen_pred = base.gen * g1 / g0
    if load_adjust:
        gen_pred *= (run.step - run.gen) / (base.step - base.gen)
    step_pred = (run.step - run.gen) + gen_pred
    ratio = cost.step(R / S if S else 0.0) / base_cost.step(R0 / S0 if S0 else 0.0)
    return PointPrediction(run, base, tokens_per_step(run.per_pos), f0, S, R, S0, R0, ratio, g1, g0, gen_pred, step_pred,
                           base.step / run.step, base.step / step_pred)


REQUIRED = ("timing_s/gen", "timing_s/step", "gen/num_tokens")


def missing_metrics(run: SweepRun) -> list[str]:
    need = list(REQUIRED) + ([] if run.is_baseline else ["spec/num_drafts"] + [f"{POS_KEY}{i}" for i in range(run.k)])
    return [k for k in need if k not in run.means]


def save_costs(path: str | Path, costs: dict[str, StepCost], lengths: dict[str, list[list[int]]], meta: dict) -> None:
    Path(path).write_text(json.dumps({"meta": meta, "configs": {k: c.to_json() for k, c in costs.items()}, "lengths": lengths}, indent=1))


def load_costs(path: str | Path) -> tuple[dict[str, StepCost], dict[str, list[list[int]]], dict]:
    """A ``--save-costs`` file: (step costs per :func:`config_key`, sampled lengths per :func:`workload_key`, meta)."""
    d = json.loads(Path(path).read_text())
    return {k: StepCost.from_json(v) for k, v in d["configs"].items()}, {k: [list(map(int, b)) for b in v] for k, v in d["lengths"].items()}, d.get("meta", {})


# ------------------------------------------------------------------ the engine microbenchmark (torch)


def spec_from_params(params: dict[str, str]):
    """An ExperimentSpec from a run's flat dotted params (keys the current spec lacks are ignored)."""
    import yaml

    from workbench.specs import ExperimentSpec

    d = ExperimentSpec().model_dump(mode="json")
    for key, raw in params.items():
        node, parts = d, key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if parts[0] == "tracking" or not isinstance(node, dict) or parts[-1] not in node:
            continue
        if raw == "None" or isinstance(node[parts[-1]], str):
            v = None if raw == "None" else raw
        else:
            try:
                v = yaml.safe_load(raw)
            except yaml.YAMLError:
                v = raw
        node[parts[-1]] = v
    return ExperimentSpec.model_validate(d)


class EngineBench:
    """Times the rollout engine (see the module doc, "Cost") and samples completion lengths.

    Models are loaded once per (target, dtype, device) and drafters once per configuration without
    k; every measurement uses the sweep runs' own spec params (target, drafter, k, sampling, batch
    shape). Timings are interleaved: ``reps`` rounds over every batch size, generation length and
    configuration (configurations innermost), the fastest of the rounds counts per cell (a load
    spike on a shared machine then hits one round of a cell, and neighbouring configurations alike).
    """

    def __init__(self, reps: int = 3, length_batches: int = 4):
        self.reps, self.length_batches = reps, length_batches
        self._targets: dict = {}
        self._drafters: dict = {}
        self._prompts: dict[str, list[list[int]]] = {}
        self._mean_len: dict[str, float] = {}

    def _target(self, spec):
        import torch

        from workbench.models.build import load_model, resolve_model
        from workbench.rollout.model import LeanLM

        key = (spec.model.target, spec.model.dtype, spec.model.device)
        if key not in self._targets:
            auto = "cuda" if torch.cuda.is_available() else "cpu"
            dev = torch.device(auto if spec.model.device == "auto" else spec.model.device)
            hf, tok = load_model(resolve_model(spec.model.target, what="model.target"), device=dev, dtype=getattr(torch, spec.model.dtype))
            self._targets[key] = (LeanLM.from_hf(hf), tok, dev)
        return self._targets[key]

    def _engine(self, spec):
        from workbench.drafter_init import drafter_as_run
        from workbench.rollout.engine import RolloutEngine

        lm, tok, dev = self._target(spec)
        dkey = (spec.model.target, spec.model.dtype, spec.model.device,
                json.dumps(spec.drafter.model_dump(mode="json", exclude={"k"}), sort_keys=True))
        if dkey not in self._drafters:  # as `wb run` builds it (init checkpoint, eagle3's V/4 draft vocabulary)
            path = resolve_model(spec.model.target, what="model.target")
            self._drafters[dkey] = drafter_as_run(spec, lm, tok, path, dev)
        return RolloutEngine(lm, self._drafters[dkey], k=spec.drafter.k, max_batch_size=spec.rollout.max_batch_size)

    def _sampling(self, spec, max_new: int, eos: bool):
        from workbench.rollout.sampling import SamplingParams

        r = spec.rollout
        return SamplingParams(r.temperature, r.top_p, r.top_k, max_new, self._target(spec)[1].eos_token_id if eos else None)

    def lengths(self, run: SweepRun) -> list[list[int]]:
        """Completion lengths of ``length_batches`` GRPO-shaped batches (prompts_per_step prompts ×
        group_size) sampled by the target (autoregressive, EOS on) from random task prompts; fixed seeds."""
        import random

        import torch

        from workbench.models.tokenizer import encode_prompt
        from workbench.tasks.loading import load_task_data

        spec = spec_from_params(run.params)
        lm, tok, dev = self._target(spec)
        t, g = spec.task, spec.grpo
        data = load_task_data(t.name, "train", t.num_train, spec.seed, t.path, t.prompt_field, t.answer_field)
        rng = random.Random(spec.seed)
        engine = self._engine(spec.model_copy(update={"drafter": spec.drafter.model_copy(update={"kind": "none"})}))
        sp = self._sampling(spec, spec.rollout.max_new_tokens, eos=True)
        gen = torch.Generator(dev).manual_seed(spec.seed)
        out = []
        with torch.no_grad():
            for _ in range(self.length_batches):
                prompts = [encode_prompt(tok, data[rng.randrange(len(data))]["prompt"]) for _ in range(g.prompts_per_step)]
                prompts = [p for p in prompts for _ in range(g.group_size)]
                out.append([len(x) for x in engine.generate(prompts, sp, gen).tokens])
        wk = workload_key(run.params)
        self._prompts[wk] = prompts[: run.chunk]
        self._mean_len[wk] = float(np.mean([x for b in out for x in b]))
        return out

    def step_costs(self, runs: list[SweepRun], progress=lambda s: None) -> dict[str, StepCost]:
        """:class:`StepCost` per :func:`config_key` of ``runs``: seconds per engine step at
        n = 1, N/8, N/4, N/2, 3N/4, N rows (N = the run's chunk; EOS ignored so n stays constant),
        from the difference of an m1- and an m2-token generation, fitted a + b·n."""
        import time

        import torch

        cells = {}  # config key -> (engine, prompts, m1, m2, device)
        for run in runs:
            ck = config_key(run.params)
            if ck in cells:
                continue
            spec = spec_from_params(run.params)
            wk = workload_key(run.params)
            if wk not in self._prompts:
                progress(f"sampling completion lengths for {wk}")
                self.lengths(run)
            m1 = max(2, min(8, spec.rollout.max_new_tokens // 2))
            m2 = int(min(spec.rollout.max_new_tokens, max(m1 + 8, round(self._mean_len[wk]))))
            cells[ck] = (spec, self._engine(spec), self._prompts[wk], m1, m2, self._target(spec)[2])

        def sizes(N: int) -> list[int]:
            return sorted({1, max(1, N // 8), max(1, N // 4), max(1, N // 2), max(1, 3 * N // 4), N})

        # (n, m) -> every config measured there back to back, so a change of machine load between
        # cells shifts the configs together and their ratios (what the prediction uses) stay put
        order: dict[tuple[int, int], list[str]] = {}
        for ck, (spec, engine, prompts, m1, m2, dev) in cells.items():
            for n in sizes(len(prompts)):
                for m in (m1, m2):
                    order.setdefault((n, m), []).append(ck)
        best: dict[tuple, tuple[float, int]] = {}  # (config, n, m) -> (fastest seconds, verification steps)
        with torch.no_grad():
            for rnd in range(self.reps + 1):  # round 0 warms up and is not kept
                progress(f"timing engine steps of {len(cells)} configurations, round {rnd}/{self.reps}")
                for (n, m), cks in sorted(order.items()):
                    for ck in cks:
                        spec, engine, prompts, m1, m2, dev = cells[ck]
                        N = len(prompts)
                        rows = [prompts[i * N // n] for i in range(n)]
                        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
                        sync()
                        t0 = time.perf_counter()
                        res = engine.generate(rows, self._sampling(spec, m, eos=False), torch.Generator(dev).manual_seed(0))
                        sync()
                        dt = time.perf_counter() - t0
                        if rnd and ((ck, n, m) not in best or dt < best[(ck, n, m)][0]):
                            best[(ck, n, m)] = (dt, res.counters.num_verify_steps)
        out = {}
        for ck, (spec, engine, prompts, m1, m2, dev) in cells.items():
            grid = {}
            for n in sorted({n for (c, n, m) in best if c == ck}):
                (t1, s1), (t2, s2) = best[(ck, n, m1)], best[(ck, n, m2)]
                grid[n] = (t2 - t1) / max(s2 - s1, 1)
            a, b = fit_affine(list(grid), list(grid.values()))
            N = max(grid)
            t1, s1 = best[(ck, N, m1)]
            # per-batch cost: what the fitted steps leave of the short run at the full batch
            out[ck] = StepCost(max(t1 - s1 * (a + b * N), 0.0), a, b, grid)
        return out
