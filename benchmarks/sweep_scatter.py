"""Per point across repeated identical sweeps: paired speedup/gen in each, the largest deviation from the
median, the widest CI half-width, speedup/step; and, per run, how its per-step log-ratio follows the step's
work (correlation with the step's longest completion and with its acceptance length) and how many measured steps
a ±3 % interval would need at that spread (the smallest n with t(0.975, n - 1) * sd / sqrt(n) <= log 1.03).

    python benchmarks/sweep_scatter.py qs-scatter-29-1 qs-scatter-29-2 qs-scatter-29-3 --store sqlite:///mlflow.db

Reads the store only (RunReader: the numbers `wb sweep` prints); times nothing.
"""

import argparse
import math
import statistics

from workbench.runs import RunReader
from workbench.stats import ratio_source


def steps_for(sd: float, rel: float = 0.03) -> int:
    """The fewest per-step log-ratios (steps after warm-up) whose Student-t 95 % interval of the mean is within
    ±``rel`` (as a ratio: half-width log(1 + rel)) when their standard deviation is ``sd``."""
    from scipy.stats import t

    n = 2
    while t.ppf(0.975, n - 1) * sd / math.sqrt(n) > math.log1p(rel):
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+", help="sweep names (--name of each wb sweep), in order")
    ap.add_argument(
        "--store", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    a = ap.parse_args()
    reader = RunReader(a.store)
    table, follow = {}, []
    for i, name in enumerate(a.sweeps, 1):
        parent = reader.find_parent("workbench.sweep", name, required=True)
        for run in reader.children(parent.info.run_id):
            kind, k = run.params.get("drafter.kind"), run.params.get("drafter.k")
            if kind == "none":
                continue
            gen, step = run.paired_ci("speedup/gen"), run.paired_ci("speedup/step")
            table.setdefault((kind, int(k)), []).append((gen, step))
            logs = [math.log(v) for v in run.series(ratio_source(run.history, "speedup/gen"))]
            longest, acc = run.series("completions/max_length"), run.series("spec/acceptance_length")
            corr = [
                statistics.correlation(logs, x) if len(x) == len(logs) > 2 and len(set(x)) > 1 else float("nan")
                for x in (longest, acc)
            ]
            follow.append((kind, int(k), i, statistics.stdev(logs), *corr))
    n = len(a.sweeps)
    print(
        f"| point | speedup/gen: {' / '.join(map(str, range(1, n + 1)))} | max dev. from median "
        f"| CI half-width (max of {n}) | speedup/step |"
    )
    print("|---|---|---|---|---|")
    for (kind, k), v in sorted(table.items()):
        gens = [g.mean for g, _ in v]
        med = statistics.median(gens)
        dev = max(abs(x / med - 1) for x in gens)
        hw = max(g.half_width for g, _ in v)
        print(
            f"| {kind} k={k} | {' / '.join(f'{x:.3f}' for x in gens)} | {100 * dev:.1f} % | {100 * hw:.1f} % "
            f"| {' / '.join(f'{s.mean:.3f}' for _, s in v)} |"
        )
    print(
        "\n| point | sweep | per-step sd of log-ratio | steps for ±3 % | corr. with longest completion "
        "| corr. with acceptance length |"
    )
    print("|---|---|---|---|---|---|")
    for kind, k, i, sd, c_long, c_acc in sorted(follow):
        print(f"| {kind} k={k} | {i} | {sd:.3f} | {steps_for(sd)} | {c_long:+.2f} | {c_acc:+.2f} |")


if __name__ == "__main__":
    main()
