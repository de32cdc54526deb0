"""A sweep's results as a pandas DataFrame, read back from MLflow.

    python examples/sweep_to_pandas.py                       # runs a small micro sweep, then reads it
    python examples/sweep_to_pandas.py --name my-sweep --no-run   # reads a sweep already in the store

Each point of a sweep is an MLflow child run tagged ``workbench.sweep`` = NAME and role ``point``; its params
are the resolved spec's dotted keys and its metrics include the paired generation speedup ``speedup/gen`` with
its 95 % interval (``speedup/gen_mean``, ``speedup/gen_ci95_low`` / ``_high``: the geometric mean of the per-step
ratios after the warm-up step). ``mlflow.search_runs`` returns them as a DataFrame.
"""

from __future__ import annotations

import argparse


def sweep_frame(name: str, tracking_uri: str | None = None):
    """The points of sweep ``name`` as a DataFrame: drafter, k, speedup/gen and its interval, one row a run."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.`workbench.sweep` = '{name}' and tags.`workbench.sweep.role` = 'point'",
    )
    cols = {
        "params.drafter.kind": "drafter",
        "params.drafter.k": "k",
        "metrics.speedup/gen_mean": "speedup_gen",
        "metrics.speedup/gen_ci95_low": "ci95_low",
        "metrics.speedup/gen_ci95_high": "ci95_high",
        "status": "status",
    }
    present = [c for c in cols if c in runs.columns]
    return runs[present].rename(columns=cols).sort_values(["drafter", "k"], ignore_index=True)


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="example-sweep")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-run", action="store_true", help="only read the sweep")
    args = ap.parse_args(argv)
    if not args.no_run:
        import workbench as wb

        wb.sweep("micro", ["drafter=ngram", "k=1,2", f"grpo.steps={args.steps}"], name=args.name)
    frame = sweep_frame(args.name)
    print(frame.to_string())
    return frame


if __name__ == "__main__":
    main()
