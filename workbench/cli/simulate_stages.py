"""`wb simulate` from stage times: the analytic model of :mod:`workbench.perf` (Leviathan's expected tokens per
verification, a verification cost model, async overlap), its check against the published numbers
(docs/design.md §6) and its calibration on one measured point. What `wb project` did; it forwards here.

Parses the options the command received, calls :mod:`workbench.perf`, renders with
:mod:`workbench.cli.project_render`. Nothing here is logged to MLflow: a projection is arithmetic on
numbers given or already logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from workbench.cli.common import _fail, _int_list, _named_floats, console

DEFAULT_K = "1..8"


@dataclass(frozen=True)
class StageInputs:
    """The options of the analytic model (seconds per GRPO step for the stages; see `wb simulate --help`)."""

    gen: Optional[float] = None
    logprob: float = 0.0
    train: float = 0.0
    prepare: float = 0.0
    data: float = 0.0
    other: float = 0.0
    from_run: Optional[str] = None
    tracking_uri: Optional[str] = None
    alpha: Optional[list[str]] = None
    per_pos: Optional[str] = None
    c: Optional[list[str]] = None
    ks: Optional[str] = None
    cost_curve: Optional[str] = None
    params: Optional[float] = None
    flops: float = 989e12
    bandwidth: float = 3.35e12
    bytes_per_param: float = 2.0
    batch: int = 256
    staleness: int = 3
    cv: float = 0.2
    async_run: Optional[str] = None

    def given(self) -> bool:
        """Whether any input of the analytic model was given (the mode `wb simulate` runs)."""
        named = (
            self.gen,
            self.from_run,
            self.alpha,
            self.per_pos,
            self.c,
            self.cost_curve,
            self.params,
            self.async_run,
        )
        return any(x is not None for x in named) or any((self.logprob, self.train, self.prepare, self.data, self.other))


def projection(s: StageInputs) -> None:
    """Gen and step speedups per drafter and k, the best k, and async overlap, from stage times."""
    from workbench import perf
    from workbench.cli import project_render as render

    k_list = list(_int_list(s.ks or DEFAULT_K, "--k"))
    rates = floats(s.per_pos, "--per-pos")
    alphas = _named_floats(s.alpha, "--alpha")
    cvals = _named_floats(s.c, "--c")
    stages: dict[str, float] = {}
    info: dict = {}
    if s.from_run:
        try:
            stages, info = perf.stages_from_mlflow(s.from_run, s.tracking_uri)
        except ValueError as e:
            _fail(str(e))
    cli_stages = dict(gen=s.gen, logprob=s.logprob, train=s.train, prepare=s.prepare, data=s.data, other=s.other)
    for key, v in cli_stages.items():
        if v is not None and (v or key not in stages):
            stages[key] = v
    if stages.get("gen") is None or stages["gen"] <= 0:
        _fail("give the gen stage time (--gen SECONDS) or an MLflow run (--from-run ID_OR_NAME)")
    if rates is not None:
        alphas.setdefault(info.get("drafter", ""), perf.alpha_from_per_position(rates))
    if not alphas and info.get("per_pos"):
        alphas[info["drafter"]] = perf.alpha_from_per_position(info["per_pos"])
    if not alphas:
        _fail("give --alpha, --per-pos, or an MLflow run with spec/acceptance_rate_pos_<i> metrics")
    if "" in alphas and len(alphas) > 1:
        alphas["drafter"] = alphas.pop("")
    alphas = {(d or "drafter"): a for d, a in alphas.items()}
    cs = {d: cvals.get(d, cvals.get("", 0.05)) for d in alphas}
    if s.cost_curve:
        try:
            cost = perf.load_cost_curve(s.cost_curve)
        except (OSError, ValueError, KeyError) as e:
            _fail(f"--cost-curve: {e}")
        cost_desc = f"measured curve {s.cost_curve}"
    elif s.params:
        cost = perf.CostModel(
            "roofline", params=s.params, flops=s.flops, bandwidth=s.bandwidth, bytes_per_param=s.bytes_per_param
        )
        cost_desc = f"roofline {s.params:.3g} params, {s.flops:.3g} FLOP/s, {s.bandwidth:.3g} B/s"
    else:
        cost = perf.CostModel()
        cost_desc = "memory-bound (verification = 1 target step)"
    rows = perf.project(stages, alphas, cs, k_list, cost, s.batch)
    best = perf.best_per_drafter(rows)
    gen_a, side_a, where = stages["gen"], sum(stages.values()) - stages["gen"], "a device per side"
    spec_gens = {d: r.gen_s for d, r in best.items()}
    if s.async_run:  # worker and trainer share the machine: each side's stage times on its share of it
        try:
            shared, _ = perf.stages_from_mlflow(s.async_run, s.tracking_uri)
        except ValueError as e:
            _fail(f"--async-run: {e}")
        gen_a, side_a = shared["gen"], sum(shared.values()) - shared["gen"]
        where = f"shared cores, stages of run {s.async_run}"
        spec_gens = {d: g * gen_a / stages["gen"] for d, g in spec_gens.items()}  # each drafter's speedup carried
    overlap = perf.async_overlap(gen_a, side_a, spec_gens, s.staleness, s.cv)
    render.projection(
        console, stages, cost_desc, s.batch, rows, best, overlap, s.cv, async_sides=(gen_a, side_a, where)
    )


def calibration(s: StageInputs, gen_speedup, acceptance_length, unknown: str, knee) -> None:
    """Fit the unknown cost (c or knee) to one measured point (``--k``, its acceptance, ``--gen-speedup``)."""
    from workbench import perf
    from workbench.cli import project_render as render

    k_list = _int_list(s.ks or DEFAULT_K, "--k")  # the one parse of --k (the measured point's k)
    if len(k_list) != 1:
        _fail(f"--calibrate: give the measured point's k as one integer with --k (got {s.ks or DEFAULT_K!r})")
    if gen_speedup is None:
        _fail(
            "--calibrate: give the measured gen speedup at that k (--gen-speedup S, e.g. speedup/gen of a paired run)"
        )
    rates, first_alpha, first_c = floats(s.per_pos, "--per-pos"), first(s.alpha, "--alpha"), first(s.c, "--c")
    try:
        a, how = perf.alpha_from_inputs(k_list[0], acceptance_length, rates, first_alpha)
        cal = perf.calibrate.calibrate(
            k_list[0], gen_speedup, a, unknown, first_c, knee, s.batch, range(1, max(7, k_list[0]) + 1)
        )
    except ValueError as e:
        _fail(str(e))
    render.calibration(console, cal, how)


def published() -> None:
    """The step model against docs/design.md §6's published stage times and speedups (exit 1 on a miss)."""
    from workbench import perf
    from workbench.cli import project_render as render

    checks = perf.seeds_check()
    render.seeds(console, checks, perf.STEP_SPEEDUP_TOLERANCE)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def floats(text: str | None, what: str) -> list[float] | None:
    """'0.8,0.6' -> [0.8, 0.6]; None when not given."""
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        _fail(f"{what}: {text!r} is not comma-separated numbers")


def first(values: list[str] | None, what: str) -> float | None:
    """--calibrate takes one value of a repeatable NAME=value option (the first; the name is ignored)."""
    return next(iter(_named_floats(values[:1], what).values()), None) if values else None
