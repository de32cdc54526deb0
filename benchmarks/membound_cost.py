"""Cost curve of a target and its drafters on this machine (issue #22): ms of one engine forward at
rows 1/2/4/8/16 with t = 1, 4, 8 tokens per row, and each drafter's cost per draft step as a
fraction c of a target decode step at the same rows.

    python benchmarks/membound_cost.py                                   # membound + membound-draft, eagle3, mtp
    python benchmarks/membound_cost.py --target tiny --draft tiny-draft --heads ""
    python benchmarks/membound_cost.py --target smollm2-135m-instruct --draft "" --heads "" --prepack
    python benchmarks/membound_cost.py --target smollm2-135m-instruct --draft "" --heads "" --prepack --compiled

--prepack: also the target with packed weights (``rollout.prepack_weights``, what `wb` runs by default on a
CPU: :meth:`LeanLM.enable_prepack` laid out for 64 rows x (k + 1) tokens, each shape's threshold from
:func:`workbench.prepack_rows.measured_min_rows`), a second copy loaded from the same checkpoint and timed in
the same interleaved rounds: a second table gives its ms, its verification cost in its own decode steps,
and packed / unpacked per cell (median of the per-round ratios: paired). --compiled (with --prepack): a
third copy, torch.compile-d with packed weights (``rollout.compile=true``: inductor fuses the ops between the
packed GEMMs), against the packed eager one in the same rounds.

Target and draft forwards: the rollout engine's own LeanLM (eager, float32), over a KV cache holding
--ctx tokens, interleaved rounds (a load spike hits one round of one cell), each timing >= ~5 ms of
back-to-back forwards; the table shows the median over rounds and the minimum in brackets.
eagle3 / mtp: the drafter as `wb run` builds it (drafter_init.drafter_as_run) but with
``drafter.init.data=none`` (untrained weights: the cost of a head does not depend on them), its
propose + accept seconds per verification step inside engine generations of n rows (EOS off),
k = 3, divided by k: seconds per draft step. c = that / the target's t = 1 forward at n rows.
A draft model's c per draft step = its t = 1 forward / the target's (its first draft step also
catches up one token: a t = 2 forward). Sampling and rejection sampling are in neither side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch

from workbench.models import load_model, resolve_model
from workbench.rollout.model import LeanLM
from workbench.timing import TimeSpent, timed


def forward_grid(lms: dict[str, LeanLM], rows: list[int], tokens: list[int], ctx: int, rounds: int) -> dict:
    """{name: {(r, t): [seconds per forward, one per round]}}, all models' cells interleaved per round."""
    g = torch.Generator().manual_seed(0)
    cells = []
    for name, lm in lms.items():
        for t in tokens:
            for r in rows:
                cache = lm.new_cache(r, ctx + t + 1)
                x = torch.randint(3, lm.cfg.vocab_size, (r, t), generator=g)
                start = torch.full((r,), ctx)
                cells.append(
                    (name, (r, t), lambda lm=lm, x=x, start=start, cache=cache: lm(x, start, cache, max_start=ctx))
                )
    out: dict = {name: {} for name in lms}
    inner = {}
    for rnd in range(rounds + 1):
        for name, key, fn in cells:
            dt, _ = timed(fn, "cpu", repeat=inner.get((name, key), 1))
            if rnd == 0:
                inner[(name, key)] = max(1, min(50, math.ceil(5e-3 / max(dt, 1e-6))))
            else:
                out[name].setdefault(key, []).append(dt)
    return out


@torch.no_grad()
def head_costs(
    kind: str, target_path, lm: LeanLM, tok, rows: list[int], k: int, rounds: int, spec_name: str
) -> dict[int, list[float]]:
    """{n: [seconds per draft step, one per round]} of an mtp/eagle3 head with untrained weights."""
    from workbench.drafter_init import drafter_as_run
    from workbench.models.tokenizer import encode_prompt
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs.load import load_spec
    from workbench.specs.resolve import drafter_init_config
    from workbench.tasks.loading import load_task_data

    spec = load_spec(spec_name, [f"drafter.kind={kind}", f"drafter.k={k}", "drafter.init.data=none"])
    drafter = drafter_as_run(drafter_init_config(spec), lm, tok, target_path, torch.device("cpu"))
    prompts = [encode_prompt(tok, p) for p in load_task_data("arith_chain", "train", 16, 0)["prompt"]]
    engine = RolloutEngine(lm, drafter, k=k, max_batch_size=max(rows))
    spent = TimeSpent("cpu")
    drafter.propose, drafter.accept = spent.wrap(drafter.propose), spent.wrap(drafter.accept)
    sp = SamplingParams(1.0, 1.0, 0, 24, None)  # EOS off: n rows live for every step
    out: dict[int, list[float]] = {}
    for rnd in range(rounds + 1):
        for n in rows:
            spent.seconds = 0.0
            res = engine.generate([prompts[i % len(prompts)] for i in range(n)], sp, torch.Generator().manual_seed(rnd))
            if rnd:
                out.setdefault(n, []).append(spent.seconds / max(res.counters.num_verify_steps, 1) / k)
    return out


def print_packed(
    grid: dict, rows: list[int], tokens: list[int], name: str = "target_packed", base: str = "target"
) -> None:
    """A variant's table (``name``: the packed target, or the compiled packed one): ms per forward (median
    [min] over rounds), verification cost in its own decode steps (t-token / 1-token forward), and
    variant / ``base`` per cell as the median of per-round ratios (the copies ran back to back in every round)."""
    pk, un = grid[name], grid[base]
    label, vs = {"target_packed": ("packed", "unpacked"), "target_compiled": ("compiled", "eager packed")}[name]
    med = {key: statistics.median(v) for key, v in pk.items()}
    title = "Packed weights (the default on a CPU)" if name == "target_packed" else "Compiled, packed weights"
    print(f"\n{title}:\n")
    print(
        "| rows | "
        + " | ".join(f"{label} ms t={t}" for t in tokens)
        + " | "
        + " | ".join(f"ratio t={t}" for t in tokens if t > 1)
        + " | "
        + " | ".join(f"{label} / {vs} t={t}" for t in tokens)
        + " |"
    )
    print("|" + "---|" * (1 + 2 * len(tokens) + len([t for t in tokens if t > 1])))
    for r in rows:
        cols = [f"{1e3 * med[(r, t)]:.2f} [{1e3 * min(pk[(r, t)]):.2f}]" for t in tokens]
        cols += [f"{med[(r, t)] / med[(r, 1)]:.2f}" for t in tokens if t > 1]
        cols += [f"{statistics.median(p / u for p, u in zip(pk[(r, t)], un[(r, t)])):.2f}" for t in tokens]
        print(f"| {r} | " + " | ".join(cols) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="membound")
    ap.add_argument("--draft", default="membound-draft", help="a draft preset or folder ('' = none)")
    ap.add_argument("--heads", default="eagle3,mtp", help="mtp/eagle3 heads to time ('' = none)")
    ap.add_argument("--spec", default="membound", help="the spec whose drafter settings the heads use")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--tokens", default="1,4,8")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--k", type=int, default=3, help="heads: draft steps per verification step while timing")
    ap.add_argument("--json", default=None, help="also write the raw numbers here")
    ap.add_argument("--prepack", action="store_true", help="also time the target with packed weights (paired)")
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="with --prepack: also a copy compiled with packed weights (rollout.compile=true), in the same rounds",
    )
    a = ap.parse_args()
    if a.compiled and not a.prepack:
        ap.error("--compiled compares against the packed eager target: add --prepack")
    rows, tokens = [int(x) for x in a.rows.split(",")], [int(x) for x in a.tokens.split(",")]
    t0 = time.time()
    tpath = resolve_model(a.target)
    hf, tok = load_model(tpath)
    lms = {"target": LeanLM.from_hf(hf)}
    if a.draft:
        lms["draft"] = LeanLM.from_hf(load_model(resolve_model(a.draft))[0])
    if a.prepack:
        from workbench.prepack_rows import measured_min_rows

        lms["target_packed"] = LeanLM.from_hf(load_model(tpath)[0])  # its own copy: packing fuses the weights
        lms["target_packed"].enable_prepack(64 * (a.k + 1), measured_min_rows)
        if a.compiled:  # compiled in the untimed first round (each new shape class compiles once)
            lms["target_compiled"] = LeanLM.from_hf(load_model(tpath)[0])
            lms["target_compiled"].enable_compile()
            lms["target_compiled"].enable_prepack(64 * (a.k + 1), measured_min_rows)
    params = {n: sum(p.numel() for p in {id(p): p for p in lm.parameters()}.values()) for n, lm in lms.items()}
    grid = forward_grid(lms, rows, tokens, a.ctx, a.rounds)
    heads = {
        kind: head_costs(kind, tpath, lms["target"], tok, rows, a.k, a.rounds, a.spec)
        for kind in filter(None, a.heads.split(","))
    }
    med = {n: {key: statistics.median(v) for key, v in cells.items()} for n, cells in grid.items()}
    low = {n: {key: min(v) for key, v in cells.items()} for n, cells in grid.items()}
    load = os.getloadavg()[0]
    print(
        f"# {a.target} ({params['target'] / 1e6:.2f}M params)"
        + (f", draft {a.draft} ({params['draft'] / 1e6:.2f}M)" if a.draft else "")
        + f"; torch {torch.__version__}, {torch.get_num_threads()} threads, ctx {a.ctx}, {a.rounds} rounds, "
        f"{time.time() - t0:.0f} s, load average (1 min) at the end {load:.2f}\n"
    )
    print(
        "| rows | "
        + " | ".join(f"target ms t={t}" for t in tokens)
        + " | "
        + " | ".join(f"ratio t={t}" for t in tokens if t > 1)
        + (" | draft ms t=1 | c draft_model" if a.draft else "")
        + "".join(f" | c {h}" for h in heads)
        + " |"
    )
    print("|" + "---|" * (1 + len(tokens) + len([t for t in tokens if t > 1]) + (2 if a.draft else 0) + len(heads)))
    for r in rows:
        tgt = med["target"]
        cols = [f"{1e3 * tgt[(r, t)]:.2f} [{1e3 * low['target'][(r, t)]:.2f}]" for t in tokens]
        cols += [f"{tgt[(r, t)] / tgt[(r, 1)]:.2f}" for t in tokens if t > 1]
        if a.draft:
            d = med["draft"][(r, 1)]
            cols += [f"{1e3 * d:.2f} [{1e3 * low['draft'][(r, 1)]:.2f}]", f"{d / tgt[(r, 1)]:.2f}"]
        cols += [f"{statistics.median(h[r]) / tgt[(r, 1)]:.2f}" for h in heads.values()]
        print(f"| {r} | " + " | ".join(cols) + " |")
    if a.prepack:
        print_packed(grid, rows, tokens)
    if a.compiled:
        print_packed(grid, rows, tokens, "target_compiled", "target_packed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "args": vars(a),
                    "params": params,
                    "load_avg_1m": load,
                    "forward_s": {n: {f"{r}x{t}": v for (r, t), v in cells.items()} for n, cells in grid.items()},
                    "head_s_per_draft_step": {h: {str(n): v for n, v in c.items()} for h, c in heads.items()},
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
