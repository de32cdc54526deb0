"""Do the speedup intervals cover a repeat? (issue #22 part 5; results in repeat-coverage-cpu.md)

A run's paired speedup has a Student-t interval over its per-step ratios: it covers the noise of the
steps within that run. A repeat of the run (another seed, or the same one minutes later) also moves
by a between-run amount that interval does not see. This script measures how often each interval
covers what it is asked to, on

(a) real repeats: the three identical quickstart sweeps of docs/results/paired-sweeps-cpu.md (their
    printed means and CIs), and every group of FINISHED paired runs in an MLflow store that differ
    only in ``seed`` (e.g. sweep membound-seeds-dm: draft_model k=2, seeds 0..4, and the same point
    of membound-k; eagle3 k=2 of membound-k and membound-seeds; repeated `wb tune` trials):
    cross-checks (does run i's CI cover run j's estimate?) and leave-one-out (do the pooled per-step
    CI, the random-effects CI and the random-effects prediction interval of the other runs cover the
    left-out run's estimate?);
(b) a simulation with a noise model fitted to those runs: per-step log ratios N(b_r, σ_r²) with σ_r
    drawn from the runs' own step sds and a between-run offset b_r ~ N(0, τ²), τ from the largest
    group; coverage of the true speedup and of a new run's estimate at n = 2, 3, 5 runs.

The intervals are workbench.stats' own (ratio_ci, runs_ci); numpy only draws. No torch, no runs.
Run (copy the store first: this only reads, but never point it at a store a sweep is writing):

    cp mlflow.db /tmp/repeats.db && python benchmarks/repeat_coverage.py --store /tmp/repeats.db

Without --store, part (a) uses only the quickstart tables and (b) the noise model recorded below.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict

import numpy as np

from workbench.stats import ratio_ci, run_log_estimate, runs_ci

# docs/results/paired-sweeps-cpu.md: three back-to-back identical quickstart sweeps (same seed), speedup/gen
# mean (3 decimals, its per-point table) and 95 % CI (2 decimals, the printed tables); 11 steps each.
QUICKSTART = {
    "draft_model k=1": [(0.965, 0.93, 1.00), (0.997, 0.97, 1.03), (0.960, 0.93, 0.99)],
    "draft_model k=3": [(0.999, 0.95, 1.05), (0.976, 0.94, 1.02), (0.982, 0.95, 1.02)],
    "draft_model k=5": [(0.920, 0.87, 0.98), (0.905, 0.84, 0.98), (0.893, 0.84, 0.95)],
    "ngram k=1": [(0.766, 0.75, 0.78), (0.766, 0.75, 0.78), (0.781, 0.76, 0.80)],
    "ngram k=3": [(0.654, 0.64, 0.67), (0.653, 0.64, 0.67), (0.657, 0.64, 0.67)],
    "ngram k=5": [(0.564, 0.54, 0.59), (0.563, 0.54, 0.58), (0.557, 0.54, 0.58)],
}
QUICKSTART_STEPS = 11
# The noise model fitted from /work/main/mlflow.db on 2026-11-25 (printed by --store): used without --store.
RECORDED = {
    "tau": 0.0314,
    "step_sds": [0.1018, 0.0227, 0.0740, 0.0170, 0.1065, 0.0980, 0.0390, 0.0338, 0.0941, 0.0497, 0.0413, 0.0600],
}


def covers(low: float | None, high: float | None, x: float) -> bool:
    return low is not None and low <= x <= high


def from_ci(mean: float, low: float, high: float, steps: int) -> tuple[float, float]:
    """(log mean, variance of it) of a printed ratio CI: its log half-width is t_{steps-1} * se."""
    from scipy import stats

    se = math.log(high / low) / (2 * float(stats.t.ppf(0.975, steps - 1)))
    return math.log(mean), se * se


def quickstart_part() -> list[str]:
    """Cross-checks and leave-one-out random-effects coverage of the three identical quickstart sweeps."""
    from workbench.stats import random_effects

    hits = total = loo_hits = loo_total = 0
    lines = [
        "| point | speedup/gen: sweep 1 / 2 / 3 | per-sweep CI covers another sweep's mean | τ (3 sweeps) | RE 95 % "
        "CI (3 sweeps) |",
        "|---|---|---:|---:|---|",
    ]
    for point, sweeps in QUICKSTART.items():
        h = sum(covers(lo, hi, sweeps[j][0]) for i, (_, lo, hi) in enumerate(sweeps) for j in range(3) if j != i)
        hits, total = hits + h, total + 6
        est = [from_ci(*s, QUICKSTART_STEPS) for s in sweeps]
        y, v = [e[0] for e in est], [e[1] for e in est]
        re = random_effects(y, v)
        for j in range(3):  # the RE interval of the other two sweeps (n = 2: t on 1 df) vs the third's mean
            rest = random_effects([y[i] for i in range(3) if i != j], [v[i] for i in range(3) if i != j])
            loo_hits, loo_total = loo_hits + covers(rest.low, rest.high, sweeps[j][0]), loo_total + 1
        lines.append(
            f"| {point} | {' / '.join(f'{m:.3f}' for m, _, _ in sweeps)} | {h}/6 | {math.expm1(re.tau) * 100:.1f} % "
            f"| {re.mean:.3f} [{re.low:.3f}, {re.high:.3f}] |"
        )
    lines += [
        "",
        f"- per-sweep CI covers another sweep's mean: **{hits}/{total}** ({hits / total:.0%}; ≈ 83 % expected if "
        "the per-step CI were all the noise)",
        f"- random-effects CI of two sweeps covers the third's mean: **{loo_hits}/{loo_total}**",
    ]
    return lines


def store_groups(path: str) -> dict[str, list]:
    """FINISHED paired runs of ``path`` grouped by their params less ``seed``, ``name`` and ``tracking.*``
    (groups of >= 2 runs): label -> [RunRecord], oldest first."""
    from workbench.runs import RunReader

    reader = RunReader(f"sqlite:///{path}")
    runs = [
        reader.load(r) for r in reader.search("attributes.status = 'FINISHED'", newest_first=False, max_results=10_000)
    ]
    groups: dict[tuple, list] = defaultdict(list)
    for r in runs:
        if (
            r.paired_ci("speedup/gen") is not None
            and len(r.series("speedup/gen_per_step") or r.series("speedup/gen")) >= 2
        ):
            groups[
                tuple(
                    sorted(
                        (k, v) for k, v in r.params.items() if k != "seed" and not k.startswith(("tracking.", "name"))
                    )
                )
            ].append(r)
    return {f"{g[0].kind} k={g[0].k}": g for g in groups.values() if len(g) >= 2}


def ratios_of(r) -> list[float]:
    return r.series("speedup/gen_per_step") or r.series("speedup/gen")


def store_part(path: str) -> tuple[list[str], dict]:
    """Per group: its runs, cross-checks (same seed and other seeds), leave-one-out coverage; the fitted noise model."""
    groups = store_groups(path)
    lines, sds, same, other, loo = [], [], [0, 0], [0, 0], defaultdict(lambda: [0, 0])
    for name, runs in groups.items():
        lines += [
            f"**{name}** ({len(runs)} runs)",
            "",
            "| run | seed | steps | speedup/gen [95 % CI] |",
            "|---|---:|---:|---|",
        ]
        cis, per = [r.paired_ci("speedup/gen") for r in runs], [ratios_of(r) for r in runs]
        for r, ci, x in zip(runs, cis, per):
            sds.append(math.sqrt(run_log_estimate(x)[1] * len(x)))
            lines.append(
                f"| {r.name} | {r.params.get('seed')} | {len(x)} | {ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}] |"
            )
        for i, ci in enumerate(cis):
            for j, cj in enumerate(cis):
                if i != j:
                    tally = same if runs[i].params.get("seed") == runs[j].params.get("seed") else other
                    tally[0], tally[1] = tally[0] + covers(ci.low, ci.high, cj.mean), tally[1] + 1
        if len(runs) >= 3:
            for j in range(len(runs)):
                rest = [x for i, x in enumerate(per) if i != j]
                pooled, re, y = ratio_ci([v for x in rest for v in x]), runs_ci(rest), cis[j].mean
                for key, lo, hi in (
                    ("pooled", pooled.low, pooled.high),
                    ("re", re.low, re.high),
                    ("pi", re.pred_low, re.pred_high),
                ):
                    loo[key][0], loo[key][1] = loo[key][0] + covers(lo, hi, y), loo[key][1] + 1
            full, pooled = runs_ci(per), ratio_ci([v for x in per for v in x])
            lines += [
                "",
                f"all {len(runs)} runs: pooled per-step CI {pooled.mean:.3f} [{pooled.low:.3f}, {pooled.high:.3f}]; "
                f"random-effects {full.mean:.3f} [{full.low:.3f}, {full.high:.3f}], τ = "
                f"{math.expm1(full.tau) * 100:.1f} %, "
                f"a new run's estimate: [{full.pred_low:.3f}, {full.pred_high:.3f}] (95 % prediction interval)",
            ]
        lines.append("")
    big = max(groups.values(), key=len)
    tau = runs_ci([ratios_of(r) for r in big]).tau
    lines += [
        f"- one run's CI covers a same-seed repeat's estimate: **{same[0]}/{same[1]}**; another seed's: "
        f"**{other[0]}/{other[1]}**",
        *(
            f"- leave-one-out, the other runs' {what} covers the left-out run's estimate: **{loo[k][0]}/{loo[k][1]}**"
            for k, what in (
                ("pooled", "pooled per-step CI"),
                ("re", "random-effects CI"),
                ("pi", "random-effects prediction interval"),
            )
            if loo[k][1]
        ),
        f"- noise model for (b): τ = {tau:.4f} (log units, DerSimonian–Laird over the {len(big)} runs of {big[0].kind} "
        f"k={big[0].k}); per-run step sds {', '.join(f'{s:.4f}' for s in sds)}",
    ]
    return lines, {"tau": tau, "step_sds": sds}


INTERVALS = ("one run's CI", "pooled per-step CI", "random-effects CI", "prediction interval")


def intervals(runs: list[list[float]]) -> dict[str, tuple[float, float]]:
    """The (low, high) of each interval a user could be shown for ``runs`` (the first run alone, all pooled,
    random-effects over them, and its prediction interval for a new run's estimate where defined)."""
    one, pooled = ratio_ci(runs[0]), ratio_ci([x for r in runs for x in r])
    out = {INTERVALS[0]: (one.low, one.high), INTERVALS[1]: (pooled.low, pooled.high)}
    if len(runs) >= 2:
        re = runs_ci(runs)
        out[INTERVALS[2]] = (re.low, re.high)
        if re.pred_low is not None:
            out[INTERVALS[3]] = (re.pred_low, re.pred_high)
    return out


def simulate(
    n: int, tau: float, step_sds: list[float], sims: int, steps: int, rng: np.random.Generator
) -> dict[str, dict]:
    """Per interval: the fraction of ``sims`` draws of n runs (plus one new run, true speedup 1) in which it
    covers the true speedup (``mean``) and the new run's estimate (``new``), and its median relative
    half-width (``hw``: sqrt(high / low) - 1)."""
    hit: dict[tuple[str, str], int] = defaultdict(int)
    width: dict[str, list[float]] = defaultdict(list)
    for _ in range(sims):
        sd = rng.choice(step_sds, size=n + 1)
        logs = rng.normal(rng.normal(0.0, tau, size=(n + 1, 1)), sd[:, None], size=(n + 1, steps))
        new = math.exp(float(logs[-1].mean()))
        for name, (lo, hi) in intervals(np.exp(logs[:n]).tolist()).items():
            hit[name, "mean"] += covers(lo, hi, 1.0)
            hit[name, "new"] += covers(lo, hi, new)
            width[name].append(math.sqrt(hi / lo) - 1)
    return {
        k: {"mean": hit[k, "mean"] / sims, "new": hit[k, "new"] / sims, "hw": float(np.median(w))}
        for k, w in width.items()
    }


def simulation_part(model: dict, sims: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [
        f"{sims} simulated sets per row; {QUICKSTART_STEPS} steps per run; per-run step sd drawn from "
        f"{len(model['step_sds'])} real runs' (median {np.median(model['step_sds']):.3f} log units).",
        "",
    ]
    for tau, what in (
        (0.0, "no between-run component"),
        (model["tau"], "fitted"),
        (2 * model["tau"], "twice the fitted"),
    ):
        lines += [
            f"**τ = {tau:.4f}** ({what})",
            "",
            "| runs | interval | covers the true speedup | covers a new run's estimate | median half-width |",
            "|---:|---|---:|---:|---:|",
        ]
        for n in (2, 3, 5):
            res = simulate(n, tau, model["step_sds"], sims, QUICKSTART_STEPS, rng)
            for name, r in res.items():
                lines.append(f"| {n} | {name} | {r['mean']:.1%} | {r['new']:.1%} | ±{r['hw']:.1%} |")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", help="a COPY of an MLflow sqlite store (path) to read the real repeats from")
    ap.add_argument("--sims", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.time()
    out = [
        "## (a) Real repeats",
        "",
        "### Three identical quickstart sweeps (docs/results/paired-sweeps-cpu.md)",
        "",
        *quickstart_part(),
        "",
    ]
    model = RECORDED
    if a.store:
        lines, model = store_part(a.store)
        out += [f"### Runs that differ only in seed, or not at all (`{a.store}`)", "", *lines, ""]
    out += ["## (b) Simulation", "", *simulation_part(model, a.sims, a.seed), f"_{time.time() - t0:.0f} s_"]
    print("\n".join(out))


if __name__ == "__main__":
    main()
