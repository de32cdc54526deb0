"""Metric histories of four micro runs, timings left out: to show that a move of code changes no result.

    PYTHONPATH=<checkout before> python benchmarks/metric_histories.py before.json
    PYTHONPATH=<checkout after>  python benchmarks/metric_histories.py after.json
    python benchmarks/metric_histories.py --compare before.json after.json

The runs (4 GRPO steps on the embedded ``micro`` target, no MLflow): draft_model with its paired plain
twin, eagle3 adapted online, ngram with greedy and sampled evaluation, dflash. Every logged metric
except wall-clock ones (``timing_s/``, ``timing_frac/``, ``speedup/``, tokens per second, ``engine/``,
``async/``) must be equal, step for step, float for float. The embedded models' folders lie inside
each checkout, so each checkout trains its own drafter inits (the same seeds: the same weights).
"""

from __future__ import annotations

import argparse
import json

BASE = ["tracking.enabled=false", "grpo.steps=4", "measure.modeled=false"]
CASES = {
    "draft_model+paired": ["drafter.kind=draft_model", "measure.paired=true", "grpo.eval_every=0"],
    "eagle3+online": ["drafter.kind=eagle3", "drafter.online.enabled=true", "grpo.eval_every=0"],
    "ngram+eval": ["drafter.kind=ngram", "grpo.eval_every=2", "grpo.eval_sampled=true"],
    "dflash": ["drafter.kind=dflash", "grpo.eval_every=0"],
}
WALL_CLOCK = ("timing_s/", "timing_frac/", "speedup/", "engine/", "async/")


def histories() -> dict[str, list[dict[str, float]]]:
    """{case: per-step metrics without wall-clock ones} of the four runs."""
    from workbench.experiment import run_experiment
    from workbench.specs import load_spec

    out = {}
    for name, over in CASES.items():
        res = run_experiment(load_spec("micro", BASE + over), progress=False)
        out[name] = [
            {k: v for k, v in h.items() if not k.startswith(WALL_CLOCK) and "per_s" not in k} for h in res.history
        ]
    return out


def differences(a: dict, b: dict) -> dict[str, list[tuple[int, str, float | None, float | None]]]:
    """{case: [(step index, metric, before, after)]} where two histories differ (a missing step or key too)."""
    out = {}
    for case in sorted(set(a) | set(b)):
        ha, hb = a.get(case, []), b.get(case, [])
        rows = []
        for i in range(max(len(ha), len(hb))):
            x, y = (ha[i] if i < len(ha) else {}), (hb[i] if i < len(hb) else {})
            rows += [(i, k, x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        out[case] = rows
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="write this checkout's histories here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.load(open(f)) for f in args.compare)
        bad = 0
        for case, rows in differences(a, b).items():
            n = sum(len(h) for h in a.get(case, [])[:1])
            print(f"{case}: {len(a.get(case, []))} steps, {n} metrics a step, {len(rows)} differing {rows[:3]}")
            bad += len(rows)
        return 1 if bad else 0
    with open(args.out, "w") as f:
        json.dump(histories(), f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
