"""The sampling operation's own cost: the keyed sample (``workbench.rollout.keyed.keyed_sample``, the
drafter-invariant sampler) against the inverse-CDF sample that rejection sampling's plain decoding draws
(``workbench.rollout.sampling.sample``), at the shapes a decode step and a k = 3 verification hand them.

    python benchmarks/keyed_op_cost.py OUT.json [--rounds 20] [--reps 50] [--threads 2] [--against OLD.py]

``--against``: another version of ``workbench/rollout/keyed.py`` (``git show REV:workbench/rollout/keyed.py >
OLD.py``) timed as a third arm, with its ratio to the current keyed sample and a check that both draw the same tokens.

Paired: each round times both samplers back to back (order alternating), ``--reps`` calls each, on the
same processed distributions (softmax of N(0, 3^2) logits at T 0.7); the ratio keyed / inverse-CDF per
round, its geometric mean and Student-t 95 % interval over rounds (``workbench.stats.ratio_ci``).
Milliseconds are a call's median over rounds. Writes the table as JSON with the host (lscpu model name).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time

SHAPES = [(64, 1, 512), (64, 4, 512), (64, 1, 49152), (64, 4, 49152)]  # (rows, positions, ids)


def _ms(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def _cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    return name or platform.processor()


def main() -> None:
    import torch

    from workbench.rollout.keyed import keyed_sample
    from workbench.rollout.sampling import sample
    from workbench.stats import ratio_ci

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against")
    a = ap.parse_args()
    old = None
    if a.against:
        import importlib.util

        spec = importlib.util.spec_from_file_location("keyed_against", a.against)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    rows = []
    for B, T, V in SHAPES:
        p = (torch.randn(B, T, V, generator=g) * 3 / 0.7).softmax(-1)  # (B, T, V)
        seeds, pos = torch.randint(0, 2**62, (B,), generator=g), torch.arange(T).expand(B, T)
        flat = p.reshape(B * T, V)
        arms = {"keyed": lambda: keyed_sample(p, seeds, pos), "inverse_cdf": lambda: sample(flat, g)}
        if old is not None:
            arms["against"] = lambda: old.keyed_sample(p, seeds, pos)
            same = bool((old.keyed_sample(p, seeds, pos) == keyed_sample(p, seeds, pos)).all())
        for fn in arms.values():
            fn()  # warm
        ms: dict[str, list[float]] = {name: [] for name in arms}
        for r in range(a.rounds):
            for name in arms if r % 2 == 0 else reversed(list(arms)):
                ms[name].append(_ms(arms[name], a.reps))
        ci = ratio_ci([k / i for k, i in zip(ms["keyed"], ms["inverse_cdf"])])
        if old is not None:
            vs = ratio_ci([k / o for k, o in zip(ms["keyed"], ms["against"])])
            extra = {"against_ms": statistics.median(ms["against"]), "keyed_over_against": vs.mean,
                     "keyed_over_against_ci95": [vs.low, vs.high], "same_tokens": same}  # fmt: skip
            ci_txt = f"{vs.mean:.2f} [{vs.low:.2f}, {vs.high:.2f}]"
            print(f"  against: {extra['against_ms']:.3f} ms, keyed / against {ci_txt}, same tokens: {same}")
        rows.append(
            {
                "rows": B, "positions": T, "ids": V,
                "keyed_ms": statistics.median(ms["keyed"]), "inverse_cdf_ms": statistics.median(ms["inverse_cdf"]),
                "ratio": ci.mean, "ratio_ci95": [ci.low, ci.high], **(extra if old is not None else {}),
            }
        )  # fmt: skip
        r = rows[-1]
        print(
            f"({B}, {T}, {V}): keyed {r['keyed_ms']:.3f} ms, inverse-CDF {r['inverse_cdf_ms']:.3f} ms, "
            f"keyed / inverse-CDF {ci.mean:.2f} [{ci.low:.2f}, {ci.high:.2f}]"
        )
    meta = {"cpu": _cpu(), "threads": a.threads, "torch": torch.__version__, "rounds": a.rounds, "reps": a.reps,
            "against": a.against}  # fmt: skip
    with open(a.out, "w") as f:
        json.dump({"host": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
