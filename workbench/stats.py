"""Paired speedups with confidence intervals, and the decisions drawn from them (docs/design.md §8).

A speedup is a ratio of two timings. On a shared machine each timing drifts by 10-25 % from
minute to minute, so the workbench never divides timings taken at different times: each GRPO step
times the speculative generation and a plain autoregressive generation of the *same prompts*, in
the same process, back to back (the order alternating per step). One step gives one paired ratio
r_i = t_autoregressive / t_speculative; a run gives n of them after warm-up.

Metric names: the per-step ratios are ``speedup/gen_per_step`` and
``speedup/step_per_step``; ``speedup/gen`` and ``speedup/step``, the columns users sort MLflow's
runs table by (it shows a metric's last value), are the run's running estimate, logged every step,
whose last value is the run's ``speedup/gen_mean`` (:func:`running_speedups`). Runs stored before
then logged the per-step ratios as ``speedup/gen``: readers fall back to it (:func:`ratio_source`).

The run's speedup is the geometric mean exp(mean(log r_i)) with a Student-t 95 % interval on the
log-ratios (ratios are multiplicative and skewed; their logs are close to symmetric, and the
interval maps back to a ratio interval that never goes below 0). A best point is called only when
its interval's lower end lies above every other point's upper end; otherwise the points whose
intervals reach the top one's are a tie.

That interval covers the noise of the steps *within* a run, not of a repeat: two runs of one setting
(another seed, or the same one minutes later) differ by more than their per-step intervals allow
(measured: 5 seeds of one membound point gave 1.16-1.34x, each with a CI of +-1-7 %). Over
n >= 2 runs the speedup is therefore a random-effects estimate (:func:`runs_ci`): each run's mean
log ratio and its variance, a between-run variance tau² (DerSimonian-Laird), and a Hartung-Knapp
interval on n-1 df, with a prediction interval for a new run's estimate.

Pure functions (lists of floats in, floats out); scipy supplies the t and normal quantiles and the
two-sample test. No torch, no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from workbench import metrics as M

CONFIDENCE = 0.95
# The fewest runs whose prediction interval for a new run (t on n-2 df) tables show: at 3 runs (1 df)
# it spans ±35-118 % of the speedup, at 5 runs (3 df) ±7-22 %, and covers a new run's estimate 96-98 %
# of the time (benchmarks/repeat-coverage-cpu.md). RunsCI still carries it from 3 runs (results.json).
PREDICTION_MIN_RUNS = 5


@dataclass(frozen=True)
class RatioCI:
    """A ratio's geometric mean over n paired samples and its two-sided confidence interval.

    ``low``/``high`` are None when n < 2 (no spread to estimate). ``half_width`` is the relative
    half-width of the interval in log space, exp(t * s / sqrt(n)) - 1 (0.05 = ±5 %).
    """

    mean: float
    low: float | None
    high: float | None
    n: int
    half_width: float | None

    def overlaps(self, other: "RatioCI") -> bool:
        """True unless one interval lies wholly above the other (unknown intervals overlap)."""
        if None in (self.low, self.high, other.low, other.high):
            return True
        return not (self.low > other.high or other.low > self.high)

    def as_metrics(self, name: str) -> dict[str, float | None]:
        """``{name}_mean``, ``{name}_ci95_low``, ``{name}_ci95_high``, ``{name}_ci95_halfwidth``, ``{name}_n``."""
        return {
            f"{name}_mean": self.mean,
            f"{name}_ci95_low": self.low,
            f"{name}_ci95_high": self.high,
            f"{name}_ci95_halfwidth": self.half_width,
            f"{name}_n": float(self.n),
        }


def paired_ratios(numerator_s: Sequence[float], denominator_s: Sequence[float]) -> list[float]:
    """Per-pair ratios numerator / denominator (e.g. autoregressive s / speculative s).

    Raises:
        ValueError: different lengths, or a non-positive time (a ratio of it has no meaning).
    """
    if len(numerator_s) != len(denominator_s):
        raise ValueError(f"paired timings need equal lengths, got {len(numerator_s)} and {len(denominator_s)}")
    if any(not (x > 0) for x in (*numerator_s, *denominator_s)):
        raise ValueError("paired timings must be > 0 seconds")
    return [a / b for a, b in zip(numerator_s, denominator_s)]


def ratio_ci(ratios: Sequence[float], confidence: float = CONFIDENCE) -> RatioCI:
    """Geometric mean of ``ratios`` with a Student-t interval on their logs.

    Raises:
        ValueError: no ratios, or a ratio <= 0.
    """
    from scipy import stats

    if not ratios:
        raise ValueError("ratio_ci needs at least one ratio")
    if any(not (r > 0) for r in ratios):
        raise ValueError(f"ratios must be > 0, got {min(ratios)}")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    m = sum(logs) / n  # exp(m) = geometric_mean(ratios), the same arithmetic
    if n < 2:
        return RatioCI(math.exp(m), None, None, n, None)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1))
    h = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return RatioCI(math.exp(m), math.exp(m - h), math.exp(m + h), n, math.exp(h) - 1.0)


def step_ratios(
    step_s: Sequence[float],
    gen_s: Sequence[float],
    gen_autoregressive_s: Sequence[float],
    draft_train_s: Sequence[float] | None = None,
) -> list[float]:
    """Per-step step speedups from the paired generation times and the run's own other stages (seconds).

    The autoregressive step is estimated as the speculative step with its gen stage replaced by
    the paired autoregressive generation and without online drafter training (``draft_train_s``; a
    plain run trains no drafter): (step - gen - draft_train + gen_ar) / step. Every other stage is the
    run's own measurement, taken in the same step (speculation does not touch them, and their
    expected cost is the same because both arms sample from the same law).

    Raises:
        ValueError: series of different lengths.
    """
    train = list(draft_train_s) if draft_train_s is not None else [0.0] * len(step_s)
    if not (len(step_s) == len(gen_s) == len(gen_autoregressive_s) == len(train)):
        raise ValueError("step_ratios needs equal-length step, gen, gen_autoregressive and draft_train series")
    plain = [s - g - t + a for s, g, t, a in zip(step_s, gen_s, train, gen_autoregressive_s)]
    return paired_ratios(plain, step_s)


def after_warmup(values: Sequence[float], warmup: int = 1) -> list[float]:
    """Drop the first ``warmup`` values (compilation, allocator and cache warm-up), unless that
    would leave none: a run shorter than its warm-up keeps all its values."""
    vals = list(values)
    return vals[warmup:] if len(vals) > warmup else vals


@dataclass(frozen=True)
class Decision:
    """Which point is best, or which points tie for best (docs/design.md §8: call a difference only when
    the intervals separate). ``best`` is None when there is a tie; ``tied`` then lists the points
    whose intervals reach the top point's (top point first)."""

    best: str | None
    tied: tuple[str, ...]
    top: str | None  # the point with the highest mean, decided or not


def decide(cis: Mapping[str, RatioCI]) -> Decision:
    """Best point by the rule above; ``cis`` maps a point label to its interval."""
    if not cis:
        return Decision(None, (), None)
    top = max(cis, key=lambda p: cis[p].mean)
    others = [p for p in cis if p != top]
    if not others and None in (cis[top].low, cis[top].high):
        return Decision(None, (), top)  # one point without an interval (unpaired): nothing is decided, nothing to name
    rivals = [p for p in others if cis[top].overlaps(cis[p])]
    if not rivals:
        return Decision(top, (), top)
    return Decision(None, (top, *sorted(rivals, key=lambda p: -cis[p].mean)), top)


@dataclass(frozen=True)
class TwoSample:
    """Welch's two-sample t-test of mean(a) - mean(b), and the smallest difference it could detect."""

    diff: float  # mean(a) - mean(b)
    p_value: float | None
    min_detectable: float | None  # at the given alpha and power (normal approximation)
    n_a: int
    n_b: int


def two_sample(a: Sequence[float], b: Sequence[float], alpha: float = 0.05, power: float = 0.8) -> TwoSample:
    """Welch's t-test (scipy) on two independent samples, e.g. final rewards of repeated runs with
    and without speculation; ``min_detectable`` = (z_{1-alpha/2} + z_power) * sqrt(s_a²/n_a + s_b²/n_b).

    Raises:
        ValueError: a sample with fewer than 2 values (no variance to test against).
    """
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"two_sample needs >= 2 values per side, got {len(a)} and {len(b)}; run more seeds (seed=0..4)"
        )
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    se = math.sqrt(va / len(a) + vb / len(b))
    if se == 0:  # identical constant samples: no evidence of a difference, none detectable either
        return TwoSample(ma - mb, 1.0 if ma == mb else 0.0, 0.0, len(a), len(b))
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    return TwoSample(ma - mb, p, z * se, len(a), len(b))


# ----------------------------------------------------------------------------- repeats: a random-effects interval


@dataclass(frozen=True)
class RunsCI:
    """A speedup over n >= 2 runs of one setting (seeds or repeats), random-effects on log ratios.

    ``mean`` = exp(mu), the geometric-mean speedup a repeat of the setting would average to;
    ``low``/``high``: its two-sided Hartung-Knapp interval; ``pred_low``/``pred_high``: where a new
    run's own estimate (its ``speedup/gen_mean``) should fall (None below 3 runs); ``tau``: the
    between-run standard deviation of the log speedup (0.06 = runs spread by about ±6 %, beyond
    their step noise); ``half_width``: exp(half-width in log space) - 1, as in RatioCI; ``n``: runs.
    """

    mean: float
    low: float
    high: float
    pred_low: float | None
    pred_high: float | None
    tau: float
    n: int
    half_width: float

    def ratio_ci(self) -> RatioCI:
        """The interval as a RatioCI (``n`` = runs) for tables, plots and :func:`decide`."""
        return RatioCI(self.mean, self.low, self.high, self.n, self.half_width)


def run_log_estimate(ratios: Sequence[float]) -> tuple[float, float]:
    """One run's estimate for :func:`random_effects`: (mean log ratio, its variance s²/m), m = the
    run's per-step ratios, s their log sd (log units; the per-run CI of :func:`ratio_ci` is built from
    the same two numbers).

    Raises:
        ValueError: fewer than 2 ratios (no within-run variance), a ratio <= 0, or all ratios equal
            (a zero variance would give the run infinite weight).
    """
    if len(ratios) < 2 or any(not (r > 0) for r in ratios):
        raise ValueError(f"a run's estimate needs >= 2 ratios > 0, got {list(ratios)[:4]}")
    logs = [math.log(r) for r in ratios]
    m = sum(logs) / len(logs)
    var = sum((x - m) ** 2 for x in logs) / (len(logs) - 1) / len(logs)
    if not var > 0:
        raise ValueError("a run whose per-step ratios are all equal has no within-run variance")
    return m, var


def dersimonian_laird_tau2(y: Sequence[float], v: Sequence[float]) -> float:
    """Between-run variance tau² (units of y²) by DerSimonian & Laird (1986, Control Clin Trials 7:177):
    max(0, (Q - (n-1)) / (Σw - Σw²/Σw)), w = 1/v, Q = Σ w (y - ȳ_w)², ȳ_w the inverse-variance mean.

    Raises:
        ValueError: fewer than 2 runs, unequal lengths, or a variance <= 0.
    """
    if len(y) != len(v) or len(y) < 2:
        raise ValueError(f"tau² needs >= 2 runs with one variance each, got {len(y)} estimates and {len(v)} variances")
    if any(not (x > 0) for x in v):
        raise ValueError("within-run variances must be > 0")
    w = [1 / x for x in v]
    sw = sum(w)
    fixed = sum(wi * yi for wi, yi in zip(w, y)) / sw
    q = sum(wi * (yi - fixed) ** 2 for wi, yi in zip(w, y))
    return max(0.0, (q - (len(y) - 1)) / (sw - sum(wi * wi for wi in w) / sw))


def hartung_knapp(y: Sequence[float], v: Sequence[float], tau2: float) -> tuple[float, float]:
    """(mu, se): the random-effects mean of y with weights 1/(v + tau²) and its Hartung-Knapp-Sidik-
    Jonkman standard error sqrt(q / Σw), q = Σ w (y - mu)² / (n-1) (IntHout et al. 2014, BMC Med Res
    Methodol 14:25), to be used with a t quantile on n-1 df. q is floored at 1 (the "ad hoc"
    modification, Röver, Knapp & Friede 2015, BMC Med Res Methodol 15:99): with 2-3 runs whose step
    noise differs, q < 1 by chance would make the interval narrower than the fixed-effect one, i.e.
    claim less between-run noise than none. Units: y's; validation as :func:`dersimonian_laird_tau2`.
    """
    w = [1 / (x + tau2) for x in v]
    sw = sum(w)
    mu = sum(wi * yi for wi, yi in zip(w, y)) / sw
    q = sum(wi * (yi - mu) ** 2 for wi, yi in zip(w, y)) / (len(y) - 1)
    return mu, math.sqrt(max(q, 1.0) / sw)


def random_effects(y: Sequence[float], v: Sequence[float], confidence: float = CONFIDENCE) -> RunsCI:
    """A random-effects interval over runs from their log estimates ``y`` and variances ``v``
    (:func:`run_log_estimate`): tau² by :func:`dersimonian_laird_tau2`, mu ± t_{n-1} * se by
    :func:`hartung_knapp`, mapped back to ratios. Prediction interval for a new run's estimate (Higgins,
    Thompson & Spiegelhalter 2009, J R Stat Soc A 172:137, t on n-2 df): mu ± t_{n-2} *
    sqrt(tau² + SE² + v̄), SE² = 1 / Σ 1/(v + tau²) (their SE of mu, not the Hartung-Knapp one),
    v̄ = mean(v), because what a user compares is a repeat's *estimate*, which carries its own step
    noise on top of the new run's true speedup; None below 3 runs.

    Raises:
        ValueError: fewer than 2 runs, unequal lengths, or a variance <= 0 (a single run has no
            between-run spread to estimate: use its per-step :func:`ratio_ci`, which covers only the
            noise of steps within that run).
    """
    from scipy import stats

    if len(y) < 2:
        raise ValueError(
            "a random-effects interval needs >= 2 runs; one run's per-step CI covers only the noise of its "
            "steps, not a repeat's: run more seeds (seed=0..2)"
        )
    tau2 = dersimonian_laird_tau2(y, v)
    n = len(y)
    mu, se = hartung_knapp(y, v, tau2)
    h = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    pred = (None, None)
    if n >= 3:
        se2 = 1 / sum(1 / (x + tau2) for x in v)
        hp = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * math.sqrt(tau2 + se2 + sum(v) / n)
        pred = (math.exp(mu - hp), math.exp(mu + hp))
    return RunsCI(math.exp(mu), math.exp(mu - h), math.exp(mu + h), *pred, math.sqrt(tau2), n, math.exp(h) - 1.0)


def runs_ci(runs: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> RunsCI:
    """:func:`random_effects` of runs given as their per-step ratios (after warm-up), one list per run.

    Raises:
        ValueError: fewer than 2 runs, or a run :func:`run_log_estimate` refuses.
    """
    est = [run_log_estimate(r) for r in runs]
    return random_effects([m for m, _ in est], [v for _, v in est], confidence)


PAIRED_SPEEDUPS = (M.SPEEDUP_GEN, M.SPEEDUP_STEP)  # the names users read: the run's estimate (see paired_summary)
PER_STEP_SUFFIX = "_per_step"


def per_step_key(name: str) -> str:
    """The per-step paired ratio behind paired speedup ``name``: ``speedup/gen`` -> ``speedup/gen_per_step``."""
    return f"{name}{PER_STEP_SUFFIX}"


PAIRED_KEYS = tuple(per_step_key(n) for n in PAIRED_SPEEDUPS)  # per-step paired ratios logged by the GRPO loop


def ratio_source(keys: Container[str], name: str) -> str:
    """Which logged key holds the per-step ratios of paired speedup ``name`` among ``keys``:
    ``{name}_per_step``; runs stored before it existed logged the per-step ratios
    under ``name`` itself, so that is read when the per-step key is absent."""
    key = per_step_key(name)
    return key if key in keys else name


def per_step_ratios(history: Sequence[Mapping[str, float]], name: str) -> list[float]:
    """The per-step paired ratios of ``name`` (e.g. ``speedup/gen``) in a per-step ``history``, in
    step order, warm-up included (:func:`ratio_source` picks the key; old runs are read too)."""
    key = ratio_source({k for h in history for k in h}, name)
    return [h[key] for h in history if key in h]


def geometric_mean(ratios: Sequence[float]) -> float:
    """exp(mean(log r)) of ratios > 0 (the point estimate of :func:`ratio_ci`'s interval)."""
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def running_speedups(history: Sequence[Mapping[str, float]], warmup: int = 1) -> dict[str, float]:
    """Each paired speedup's running estimate after the last step of ``history`` (a live run's
    steps so far, the current one last): ``speedup/gen`` / ``speedup/step`` = geometric mean of the
    per-step ratios ``{name}_per_step`` after ``warmup`` steps (:func:`after_warmup`; all of them
    while the run is still inside its warm-up). Logged every step, its last value is the run's
    estimate, ``{name}_mean`` of :func:`paired_summary` (MLflow's tables show a metric's last
    value). Empty when the run is not paired."""
    out: dict[str, float] = {}
    for name in PAIRED_SPEEDUPS:
        vals = after_warmup([h[per_step_key(name)] for h in history if per_step_key(name) in h], warmup)
        if vals:
            out[name] = geometric_mean(vals)
    return out


def paired_summary(history: Sequence[Mapping[str, float]], warmup: int = 1) -> dict[str, float | None]:
    """A run's paired speedups: for each of PAIRED_SPEEDUPS whose per-step ratios (PAIRED_KEYS) are in
    the per-step ``history``, the geometric mean and 95 % interval of the ratios after ``warmup``
    steps, as ``speedup/gen_mean``, ``speedup/gen_ci95_low``, ``..._ci95_high``,
    ``..._ci95_halfwidth`` (relative), ``..._n`` (steps). Empty when the run was not paired."""
    out: dict[str, float | None] = {}
    for name in PAIRED_SPEEDUPS:
        vals = after_warmup(per_step_ratios(history, name), warmup)
        if vals:
            out.update(ratio_ci(vals).as_metrics(name))
    return out


# ----------------------------------------------------------------------------- proportions: held-out accuracy


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval (low, high) of a binomial proportion successes / n (Wilson 1927).

    Raises:
        ValueError: n < 1 or successes outside 0..n.
    """
    from scipy import stats

    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need n >= 1 and 0 <= successes <= n, got {successes} / {n}")
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def proportion_diff_ci(
    s1: int, n1: int, s2: int, n2: int, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """p2 - p1 with Newcombe's hybrid score interval (Newcombe 1998, method 10: from the two Wilson
    intervals), e.g. held-out accuracy after training (2) minus before (1). For two independent
    samples; where the same prompts are scored twice the positive correlation makes it conservative.

    Returns (difference, low, high). Raises ValueError as :func:`wilson`.
    """
    p1, p2 = s1 / max(n1, 1), s2 / max(n2, 1)
    l1, u1 = wilson(s1, n1, confidence)
    l2, u2 = wilson(s2, n2, confidence)
    d = p2 - p1
    return d, d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
