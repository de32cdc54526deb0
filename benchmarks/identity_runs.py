"""GRPO with and without speculation, compared step by step: for each seed, every finished run of an MLflow
experiment against the same seed's ``drafter.kind=none`` run, metric by metric (the learning metrics: rewards,
losses, gradient norms, completion lengths, held-out evaluation).

    python benchmarks/identity_runs.py EXPERIMENT [--store sqlite:///mlflow.db] [--json OUT.json]

Prints, per (seed, drafter): the steps compared, how many metrics were equal at every step, the largest
absolute difference of any other, and the speculative run's ``gen_autoregressive/differing_tokens`` summed
over its steps (where its paired twin ran). Under keyed sampling (the workbench engine's default) a
speculative run is the plain run: every metric equal.
"""

from __future__ import annotations

import argparse
import json
import sys

PREFIXES = (
    "reward/",
    "loss/",
    "grad_norm",
    "kl",
    "clip_frac",
    "completions/",
    "eval/",
    "eval_sampled/",
    "gen/num_tokens",
)


def history(client, run_id: str, key: str) -> dict[int, float]:
    """{step: value} of one metric of one run."""
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def compare(client, plain, other) -> dict:
    """The learning metrics of ``other`` against ``plain`` (MLflow runs), step by step."""
    keys = sorted(k for k in plain.data.metrics if k.startswith(PREFIXES))
    equal, worst = [], {}
    for key in keys:
        a, b = history(client, plain.info.run_id, key), history(client, other.info.run_id, key)
        steps = sorted(set(a) & set(b))
        if steps and all(a[s] == b[s] for s in steps) and len(a) == len(b):
            equal.append(key)
        else:
            worst[key] = max((abs(a[s] - b[s]) for s in steps), default=float("nan"))
    twin = history(client, other.info.run_id, "gen_autoregressive/differing_tokens")
    return {
        "steps": len(history(client, plain.info.run_id, "reward/mean")),
        "metrics": len(keys),
        "equal": len(equal),
        "differ": worst,
        "twin_differing_tokens": sum(twin.values()) if twin else None,
        "twin_steps": len(twin),
        "runs": [plain.info.run_id, other.info.run_id],
    }


def main() -> None:
    from mlflow import MlflowClient

    ap = argparse.ArgumentParser()
    ap.add_argument("experiment")
    ap.add_argument("--store", default="sqlite:///mlflow.db")
    ap.add_argument("--json")
    a = ap.parse_args()
    client = MlflowClient(tracking_uri=a.store)
    exp = client.get_experiment_by_name(a.experiment)
    if exp is None:
        print(f"error: no experiment {a.experiment!r} in {a.store}; give --store the runs' store", file=sys.stderr)
        raise SystemExit(2)
    runs = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'", order_by=["start_time"])
    by_seed: dict[str, dict[str, object]] = {}
    for r in runs:
        by_seed.setdefault(r.data.params.get("seed", "?"), {})[r.data.params.get("drafter.kind", "?")] = r
    out = []
    for seed, arms in sorted(by_seed.items()):
        if "none" not in arms:
            continue
        for kind, run in arms.items():
            if kind == "none":
                continue
            c = compare(client, arms["none"], run) | {"seed": seed, "drafter": kind}
            out.append(c)
            diff = ", ".join(f"{k} {v:.3g}" for k, v in sorted(c["differ"].items())) or "none"
            print(
                f"seed {seed}, {kind} vs none: {c['steps']} steps, {c['equal']}/{c['metrics']} metrics equal at every "
                f"step; differing: {diff}; twin differing tokens {c['twin_differing_tokens']}"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
