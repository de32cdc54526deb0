"""The analytic performance model: the cost of a target forward, the projected gen, step and async speedups.

Pure functions and small dataclasses; every assumption is named here. Seconds throughout.

Generation (Leviathan et al. 2023, arXiv 2211.17192; docs/design.md §4, independence assumption): with
per-token acceptance α and k drafts per verification, tokens per verification step
E[N] = (1 − α^(k+1)) / (1 − α). One verification costs ``verify_ratio(k)`` target decode steps
and k drafter steps cost k·c, so the gen speedup is S = E[N] / (k·c + verify_ratio(k)).
verify_ratio(k) = T(B·(k+1)) / T(B): the target's forward time with B rows × (k+1) tokens in flight
over its time with B tokens (one decode step). It is 1 while the forward is memory-bound and grows
~(k+1) once compute-bound. T comes from a :class:`CostModel`: constant (memory-bound), a measured
curve (tokens in flight -> seconds, interpolated), or a roofline
T(tokens) = max(2·params·tokens / FLOP/s, weight_bytes / bandwidth) (KV-cache traffic ignored).

Step (synchronous, docs/design.md §3): only the gen stage changes, so
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

E[N], the α fits and S are :mod:`workbench.rollout.cost`'s (the one module of the cost maths, shared
with the engine's adaptive k and ``wb simulate``); this module adds the forward's cost and the stages.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.rollout.cost import expected_tokens, gen_speedup

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
        """Seconds of one forward over ``tokens`` tokens in flight (kind "constant": 1, a unit step)."""
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
    CSV (columns tokens, seconds; a header row is optional). Tokens in flight -> seconds per forward.

    Raises:
        OSError: the file cannot be read. ValueError: no (tokens, seconds) point (or bad JSON).
        KeyError: a JSON object without "tokens" / "seconds".
    """
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


def step_speedup(step: float, gen: float, s_gen: float) -> float:
    """step / (step − gen + gen / S) for a synchronous step of ``step`` seconds with ``gen`` seconds
    of generation sped up S-fold: only the gen stage gets faster (docs/design.md §3)."""
    return step / (step - gen + gen / s_gen)


def async_step_time(
    gen: float, train_side: float, staleness: int, cv: float = 0.0, steps: int = 4000, seed: int = 0
) -> float:
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


def async_overlap(
    gen: float, train_side: float, spec_gens: dict[str, float], staleness: int, cv: float = 0.0
) -> list[tuple[int, float, dict[str, float]]]:
    """Mean step seconds of the asynchronous pipeline per staleness s = 0 (synchronous) .. ``staleness``:
    (s, autoregressive with ``gen`` seconds of generation, {name: with that name's gen seconds}),
    the train side ``train_side`` seconds throughout (:func:`async_step_time`)."""
    return [
        (
            s,
            async_step_time(gen, train_side, s, cv),
            {d: async_step_time(g, train_side, s, cv) for d, g in spec_gens.items()},
        )
        for s in range(staleness + 1)
    ]


@dataclass
class Projection:
    """One drafter × k of :func:`project`: the model's inputs and its gen and step speedups (seconds per step)."""

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


def project(
    stages: dict[str, float],
    alphas: dict[str, float],
    cs: dict[str, float],
    ks: list[int],
    cost: CostModel | None = None,
    batch: int = 256,
) -> list[Projection]:
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
            out.append(
                Projection(
                    d,
                    k,
                    a,
                    cs[d],
                    expected_tokens(a, k),
                    vr,
                    s,
                    gen / s,
                    step - gen + gen / s,
                    step_speedup(step, gen, s),
                )
            )
    return out


def best_per_drafter(rows: list[Projection]) -> dict[str, Projection]:
    """Per drafter, the row with the largest gen speedup (the step speedup is monotone in it)."""
    best: dict[str, Projection] = {}
    for r in rows:
        if r.drafter not in best or r.gen_speedup > best[r.drafter].gen_speedup:
            best[r.drafter] = r
    return best
