"""One GRPO step on the cluster: gen (autoregressive and speculative), logprob, train, sync and async.

- train: 3 × the forward FLOPs (forward + backward, Narayanan et al. 2021, arXiv 2104.04473) over
  every token of the step (prompt + response of each row) / (mfu · peak · training GPUs); a sequence
  of S tokens costs 2 · matmul params · S + 4 · layers · heads · head_dim · S²/2 forward FLOPs (the
  causal attention term), so with attention left out it is the familiar 6 · N_active · tokens;
- logprob: one forward (two with the reference policy) / (logprob_mfu · peak · GPUs);
- data and prepare: given seconds (the scenario's ``train.data_s``, ``train.prepare_s``);
- synchronous step (staleness 0, generation and training colocated on all GPUs): the sum of the
  stages (docs/design.md §3); only gen changes with speculation;
- asynchronous (staleness s ≥ 1): ``async.gen_fraction`` of the GPUs generate, the rest train;
  gen and the train side (data + prepare + logprob + train) form the two-stage pipeline of
  :func:`workbench.perf.analytic.async_step_time` (per-step gen variation ``async.cv``);
- best k: the k of ``speculation.k_scan`` with the shortest gen stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from workbench.perf.analytic import async_step_time
from workbench.perf.simulate.costs import matmul_params
from workbench.perf.simulate.rollout import GenResult, gen_stage, response_lengths
from workbench.perf.simulate.scenario import ModelShape, Scenario
from workbench.rollout.cost import best_of


def sequence_flops(m: ModelShape, seq: np.ndarray | float) -> np.ndarray | float:
    """Forward FLOPs of causal sequences of ``seq`` tokens: 2 · matmul params · S + 2 · layers · heads · head_dim ·
    S²."""
    return 2.0 * matmul_params(m) * seq + 2.0 * m.layers * m.heads * m.head_dim * np.asarray(seq, dtype=float) ** 2


def step_forward_flops(sc: Scenario, lengths: np.ndarray) -> float:
    """Forward FLOPs over every row of the step (prompt + response)."""
    return float(np.sum(sequence_flops(sc.model, sc.workload.prompt_len + lengths.astype(float))))


def train_s(sc: Scenario, lengths: np.ndarray, gpus: int) -> float:
    """3 × forward FLOPs / (mfu · peak · gpus): the policy update."""
    return 3.0 * step_forward_flops(sc, lengths) / (sc.train.mfu * sc.hardware.flops * gpus)


def logprob_s(sc: Scenario, lengths: np.ndarray, gpus: int) -> float:
    """(1 + reference) forwards / (logprob_mfu · peak · gpus): the logprob stage."""
    passes = 2.0 if sc.train.reference else 1.0
    return passes * step_forward_flops(sc, lengths) / (sc.train.logprob_mfu * sc.hardware.flops * gpus)


def split_gpus(sc: Scenario) -> tuple[int, int]:
    """(generating GPUs, training GPUs) of the asynchronous pipeline: whole replicas for generation,
    at least one replica and at least one GPU left for training."""
    tp, n = sc.gen.tp, sc.cluster.gpus
    gen = max(tp, int(round(sc.async_.gen_fraction * n / tp)) * tp)
    if gen >= n:
        if n - tp < 1:
            raise ValueError(f"async needs GPUs for both sides: cluster.gpus {n} is one replica (gen.tp {tp})")
        gen = n - tp
    return gen, n - gen


@dataclass
class StepResult:
    """One scenario's step: seconds per stage, autoregressive (ar) and speculative (spec) at k."""

    name: str
    k: int
    gpus: int
    acceptance_length: float
    gen_ar: float
    gen_spec: float
    logprob: float
    train: float
    data: float
    prepare: float
    replicas: int
    rows_in_flight_ar: float
    rows_in_flight_spec: float
    staleness: int = 0
    async_ar: float | None = None  # mean async step seconds (staleness s), autoregressive
    async_spec: float | None = None
    gen_speedup_by_k: dict[int, float] = field(default_factory=dict)

    @property
    def other(self) -> float:
        return self.logprob + self.train + self.data + self.prepare

    @property
    def step_ar(self) -> float:
        return self.gen_ar + self.other

    @property
    def step_spec(self) -> float:
        return self.gen_spec + self.other

    @property
    def gen_speedup(self) -> float:
        return self.gen_ar / self.gen_spec

    @property
    def step_speedup(self) -> float:
        return self.step_ar / self.step_spec

    @property
    def e2e_speedup(self) -> float:
        """Synchronous autoregressive step / the step at this staleness with speculation."""
        return self.step_ar / (self.async_spec if self.async_spec is not None else self.step_spec)

    @property
    def async_speedup(self) -> float | None:
        """Synchronous / asynchronous step, both autoregressive (asynchrony alone)."""
        return None if self.async_ar is None else self.step_ar / self.async_ar

    @property
    def best_k(self) -> int | None:
        return best_of(self.gen_speedup_by_k) if self.gen_speedup_by_k else None

    def record(self) -> dict:
        """A flat JSON-able record: the fields and the derived speedups."""
        out = asdict(self)
        out["gen_speedup_by_k"] = {str(k): v for k, v in self.gen_speedup_by_k.items()}
        for p in ("step_ar", "step_spec", "gen_speedup", "step_speedup", "e2e_speedup", "async_speedup", "best_k"):
            out[p] = getattr(self, p)
        return out


def simulate(sc: Scenario, scan: bool = True) -> StepResult:
    """The step of scenario ``sc`` (module doc) at its ``speculation.k``; ``scan``: also the gen
    speedup at every k of ``speculation.k_scan`` (for the best k)."""
    lengths = response_lengths(sc)
    n, k = sc.cluster.gpus, sc.speculation.k
    ar = gen_stage(sc, 0, n, lengths)
    spec: GenResult = gen_stage(sc, k, n, lengths) if sc.speculation.drafter != "none" else ar
    res = StepResult(
        sc.name,
        k,
        n,
        spec.tokens_per_step,
        ar.seconds,
        spec.seconds,
        logprob_s(sc, lengths, n),
        train_s(sc, lengths, n),
        sc.train.data_s,
        sc.train.prepare_s,
        ar.replicas,
        ar.rows_in_flight,
        spec.rows_in_flight,
    )
    if scan and sc.speculation.drafter != "none":
        res.gen_speedup_by_k = {
            j: ar.seconds / (spec.seconds if j == k else gen_stage(sc, j, n, lengths).seconds)
            for j in sorted(set(sc.speculation.k_scan))
        }
    s = sc.async_.staleness
    res.staleness = s
    if s >= 1:
        g, t = split_gpus(sc)
        side = sc.train.data_s + sc.train.prepare_s + logprob_s(sc, lengths, t) + train_s(sc, lengths, t)
        res.async_ar = async_step_time(gen_stage(sc, 0, g, lengths).seconds, side, s, sc.async_.cv)
        res.async_spec = async_step_time(gen_stage(sc, k, g, lengths).seconds, side, s, sc.async_.cv)
    return res
