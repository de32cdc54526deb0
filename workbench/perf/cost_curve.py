"""Cost curves of the rollout engine's forwards, measured once per machine and model and cached.

What ``speedup/gen_modeled`` (:mod:`workbench.perf.modeled`) turns counted forwards into seconds with
(docs/design.md §4 and §8: "the measured cost of a target forward as a function of tokens in flight
belongs in the model"):

- **target curve**: seconds of one batched forward of the engine's own :class:`LeanLM` (the plain
  decode/verify path, compiled when ``rollout.compile``) as a function of the tokens in flight
  T = rows × tokens per row. Measured on a grid T = 1, 2, 3, 4, 6, 8, 12, ... up to
  rows_max × t_max (rows_max = the rollout batch, t_max = max(8, k+1)), each point with the shape
  rows = min(T, rows_max), ⌈T / rows⌉ tokens per row, over a KV cache holding ``ctx`` tokens of a
  typical context; the fastest of ``reps`` interleaved rounds (round 0 warms up), made
  non-decreasing in T (a forward over more tokens is never cheaper; a dip is noise). Assumption:
  shapes with the same tokens in flight cost the same (KV-cache reads, which grow with rows, not
  tokens, are ignored, as in the roofline of :mod:`workbench.perf.analytic`).
- **drafter cost** per verification step (all k draft steps) at n rows:
  ``draft_model``: from the draft model's own curve, measured the same way: its propose runs one
  forward of 2 tokens per row (catch-up) and k−1 of one token, so d(2n) + (k−1)·d(n);
  ``mtp`` / ``eagle3`` / ``ngram`` / ``suffix``: measured, the drafter's own ``propose`` + ``accept`` seconds per
  verification step inside short engine generations (EOS off, n = 1 and rows_max rows), fitted
  a + b·n (:func:`workbench.perf.steps.fit_affine`). For mtp/eagle3 that is their head forwards and
  sampling; for ngram it is the host/tensor time of the suffix match (measured, not assumed 0).

Cache: ``<cache_dir>/cost_curves/<key>.json``, key = hash of the model config, dtype, device,
torch version, CPU/GPU name, torch threads, compile and packed-weights flags and the measurement's shape parameters
(see :func:`curve_key`); a second run on the same machine and model loads it without measuring.
Sampling, rejection sampling, bookkeeping and the prefill are not in these costs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import time

import torch

from drafters import draft_cost_of
from workbench.cache import cache_dir
from workbench.files import write_text
from workbench.perf.analytic import CostModel
from workbench.perf.steps import DrafterCost, fit_affine  # noqa: F401 (DrafterCost: re-exported, it lived here)
from workbench.progress import progress_bar
from workbench.rollout.packing import is_packed
from workbench.timing import TimeSpent, device_name, timed  # noqa: F401 (device_name: re-exported, it lived here)

CURVE_VERSION = 1


def curve_key(lm, extra: dict) -> tuple[str, dict]:
    """(12 hex chars, the fields hashed) for ``lm`` (a :class:`LeanLM`) on this machine; ``extra``
    holds the measurement's own parameters (shape grid, context, drafter config)."""
    w = lm.lm_head.weight
    fields = {
        "version": CURVE_VERSION,
        "config": dataclasses.asdict(lm.cfg),
        "dtype": str(w.dtype),
        "device": w.device.type,
        "torch": torch.__version__,
        "machine": device_name(w.device),
        "threads": torch.get_num_threads(),
        "compiled": "_compiled" in lm.__dict__,
        **({"prepacked": 2} if is_packed(w) else {}),
        **extra,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12], fields


def cache_path(key: str):
    return cache_dir() / "cost_curves" / f"{key}.json"


def _load(key: str) -> dict | None:
    try:
        return json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None


def _save(key: str, data: dict) -> None:
    try:  # atomic: concurrent runs write identical-purpose files
        write_text(cache_path(key), json.dumps(data, indent=1), sealed=False)
    except OSError:  # a read-only cache: the curve serves this run and is measured again next time
        pass


def _when(t0: float) -> dict:
    """Provenance of a measurement: seconds it took, date, load average (a loaded machine measures
    slow forwards: delete the file to measure again)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "measured_s": round(time.perf_counter() - t0, 3),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_1m": load,
    }


def token_grid(max_tokens: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (×1.5 / ×4/3 steps) up to and including ``max_tokens``."""
    out, t = [], 1
    while t < max_tokens:
        out.append(t)
        t = t + 1 if t < 2 else (t * 3 // 2 if (t & (t - 1)) == 0 else t * 4 // 3)
    return out + [max_tokens]


def shapes(rows_max: int, t_max: int) -> list[tuple[int, int]]:
    """(rows, tokens per row) per grid point: rows = min(T, rows_max), ⌈T / rows⌉ tokens each."""
    out = []
    for T in token_grid(rows_max * t_max):
        rows = min(T, rows_max)
        shape = (rows, -(-T // rows))
        if shape not in out:
            out.append(shape)
    return out


@torch.no_grad()
def measure_forward_curve(
    lm, rows_max: int, t_max: int, ctx: int, reps: int = 3, on_round=None, budget_s: float = 2.0
) -> CostModel:
    """Seconds of one ``lm`` forward per tokens in flight (see the module doc).

    At most ``reps`` timed rounds, fewer once ``budget_s`` seconds are spent (at least one).
    ``on_round(i, info)`` is called after each round (a progress bar's update)."""
    t_start = time.perf_counter()
    w = lm.lm_head.weight
    dev = w.device
    g = torch.Generator(dev).manual_seed(0)  # never the run's RNG
    cells = []
    for rows, t in shapes(rows_max, t_max):
        cache = lm.new_cache(rows, ctx + t + 1)
        x = torch.randint(3, lm.cfg.vocab_size, (rows, t), generator=g, device=dev)
        start = torch.full((rows,), ctx, device=dev)
        cells.append(((rows, t), lambda x=x, start=start, cache=cache: lm(x, start, cache)))
    best = [math.inf] * len(cells)
    inner = [1] * len(cells)
    for rnd in range(reps + 1):  # interleaved rounds: a load spike hits one round of a cell
        for i, (_, fn) in enumerate(cells):
            dt, _ = timed(fn, dev, repeat=inner[i])  # seconds per forward, inner[i] back to back
            if rnd == 0:
                inner[i] = max(1, min(20, math.ceil(2e-3 / max(dt, 1e-6))))  # >= ~2 ms per timing
            else:
                best[i] = min(best[i], dt)
        if on_round is not None:
            on_round(rnd + 1, "warm-up" if rnd == 0 else f"round {rnd}/{reps}")
        if rnd and time.perf_counter() - t_start > budget_s:
            break
    pts = sorted((r * t, s) for ((r, t), _), s in zip(cells, best))
    secs, run = [], 0.0
    for _, s in pts:
        run = max(run, s)
        secs.append(run)
    return CostModel("curve", [float(T) for T, _ in pts], secs)


def forward_curve(
    lm, rows_max: int, t_max: int, ctx: int, label: str, progress: bool = True, reps: int = 3
) -> tuple[CostModel, bool]:
    """The cached curve of ``lm`` (measured and written on a miss). Returns (curve, loaded from cache)."""
    ctx = max(1, min(ctx, lm.cfg.max_position_embeddings - t_max - 1))
    key, fields = curve_key(lm, {"what": "forward", "rows_max": rows_max, "t_max": t_max, "ctx": ctx, "reps": reps})
    hit = _load(key)
    if hit is not None:
        return CostModel("curve", hit["tokens"], hit["seconds"]), True
    t0 = time.perf_counter()
    with progress_bar(progress) as bar:
        task = bar.add_task(f"cost curve {label}", total=reps + 1, info="")
        curve = measure_forward_curve(
            lm, rows_max, t_max, ctx, reps, lambda i, info: bar.update(task, completed=i, info=info)
        )
    _save(key, {"key": fields, "tokens": curve.tokens, "seconds": curve.seconds, **_when(t0)})
    return curve, False


@torch.no_grad()
def measure_drafter_steps(
    target,
    drafter,
    k: int,
    prompts: list[list[int]],
    rows_max: int,
    sampling,
    reps: int = 3,
    on_round=None,
    budget_s: float = 3.0,
) -> tuple[float, float]:
    """(a, b): the drafter's propose + accept seconds per verification step ≈ a + b·n, timed inside
    engine generations of n = 1 and ``rows_max`` rows (EOS off, so n stays constant); the fastest
    of at most ``reps`` rounds, fewer once ``budget_s`` seconds are spent (at least one).
    ``on_round(i, info)`` is called after each round (a progress bar's update)."""
    t_start = time.perf_counter()
    from workbench.rollout_builder import EngineConfig, workbench_backend

    dev = target.lm_head.weight.device
    if not drafter.trainable:
        # A drafter without weights (ngram, suffix) is timed on a copy: suffix keeps earlier rollouts
        # across generate() calls, and these (EOS off) must not enter the run's history, nor make a
        # run's acceptance depend on whether this cost was measured or read from the cache.
        drafter = copy.deepcopy(drafter)
    engine = workbench_backend(target, drafter, k, EngineConfig(max_batch_size=rows_max))
    spent = TimeSpent(dev)
    drafter.propose, drafter.accept = spent.wrap(drafter.propose), spent.wrap(drafter.accept)
    best: dict[int, float] = {}
    try:
        for rnd in range(reps + 1):
            for n in sorted({1, rows_max}):
                rows = [prompts[i % len(prompts)] for i in range(n)]
                spent.seconds = 0.0
                out = engine.generate(rows, sampling, torch.Generator(dev).manual_seed(rnd))
                per = spent.seconds / max(out.counters.num_verify_steps, 1)
                if rnd:
                    best[n] = min(best.get(n, math.inf), per)
            if on_round is not None:
                on_round(rnd + 1, "warm-up" if rnd == 0 else f"round {rnd}/{reps}")
            if rnd and time.perf_counter() - t_start > budget_s:
                break
    finally:
        del drafter.propose, drafter.accept  # the instance attributes: back to the class methods
    return fit_affine(list(best), list(best.values()))


def drafter_cost(
    spec, target, drafter, prompts: list[list[int]], rows_max: int, ctx: int, progress: bool = True
) -> tuple[DrafterCost, bool]:
    """The cached :class:`DrafterCost` of the spec's drafter (see the module doc). Returns (cost, from cache)."""
    from workbench.specs.resolve import rollout_config

    d, k = spec.drafter, spec.drafter.k
    if draft_cost_of(d.kind) == "model":
        curve, hit = forward_curve(drafter.model, rows_max, 2, ctx, f"draft model ({d.model})", progress)
        return DrafterCost(d.kind, k, "draft model forward curve: d(2n) + (k-1)·d(n)", curve=curve), hit
    how = {
        "ngram": "measured host time of propose (suffix match)",
        "suffix": "measured host time of propose + accept (suffix tries; not the per-batch build)",
    }.get(d.kind, "measured head forwards (propose + accept)")
    conf = d.model_dump(mode="json", exclude={"init", "online", "model"})
    key, fields = curve_key(target, {"what": "drafter", "drafter": conf, "rows_max": rows_max, "ctx": ctx})
    hit = _load(key)
    if hit is not None:
        return DrafterCost(d.kind, k, how, a=hit["a_s"], b=hit["b_s"]), True
    t0 = time.perf_counter()
    r = spec.rollout
    m = max(2, min(16, r.max_new_tokens, target.cfg.max_position_embeddings - max(map(len, prompts)) - k - 2))
    sp = rollout_config(spec, max_new_tokens=m).sampling  # no tokenizer: EOS off, so n stays constant
    with progress_bar(progress) as bar:
        task = bar.add_task(f"drafter cost {d.kind} k={k}", total=4, info="")
        a, b = measure_drafter_steps(
            target, drafter, k, prompts, rows_max, sp, 3, lambda i, info: bar.update(task, completed=i, info=info)
        )
    _save(key, {"key": fields, "a_s": a, "b_s": b, **_when(t0)})
    return DrafterCost(d.kind, k, how, a=a, b=b), False
