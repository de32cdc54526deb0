"""`wb project`: the performance model (projection, published seeds, calibration;
``--sweep`` is `wb simulate --from-sweep`).

Parses options, calls :mod:`workbench.perf`, renders with :mod:`workbench.cli.project_render`."""

from __future__ import annotations

from typing import Optional

import typer

from workbench.cli.common import _fail, _int_list, _named_floats, app, console


@app.command(context_settings={"allow_extra_args": False})
def project(
    gen: Optional[float] = typer.Option(None, "--gen", help="Seconds of the gen stage per step (autoregressive)."),
    logprob: float = typer.Option(0.0, "--logprob", min=0.0, help="Seconds of the logprob stage."),
    train: float = typer.Option(0.0, "--train", min=0.0, help="Seconds of the train stage."),
    prepare: float = typer.Option(0.0, "--prepare", min=0.0, help="Seconds of the prepare stage (weight sync)."),
    data: float = typer.Option(0.0, "--data", min=0.0, help="Seconds of the data stage."),
    other: float = typer.Option(0.0, "--other", min=0.0, help="Other seconds per step (draft_train, reward, untimed)."),
    run_ref: Optional[str] = typer.Option(
        None,
        "--run",
        help="MLflow run id or name: stage times = mean timing_s/<stage>, α from spec/acceptance_rate_pos_<i>.",
    ),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."
    ),
    alpha: Optional[list[str]] = typer.Option(
        None, "--alpha", help="Per-token acceptance α, or DRAFTER=α (repeatable)."
    ),
    per_pos: Optional[str] = typer.Option(
        None, "--per-pos", help="Per-position acceptance rates 'r0,r1,..' (α fitted from r_i ≈ α^(i+1))."
    ),
    c: Optional[list[str]] = typer.Option(
        None, "--c", help="Drafter/target step cost ratio, or DRAFTER=c (repeatable; default 0.05)."
    ),
    ks: str = typer.Option("1..8", "--k", help="Speculation lengths: LOW..HIGH or a,b,c."),
    cost_curve: Optional[str] = typer.Option(
        None, "--cost-curve", help="JSON/CSV of target forward seconds vs tokens in flight."
    ),
    params: Optional[float] = typer.Option(None, "--params", help="Roofline: target parameter count (e.g. 8e9)."),
    flops: float = typer.Option(989e12, "--flops", min=1.0, help="Roofline: GPU FLOP/s (default H100 dense bf16)."),
    bandwidth: float = typer.Option(
        3.35e12, "--bandwidth", min=1.0, help="Roofline: GPU memory bandwidth, bytes/s (default H100)."
    ),
    bytes_per_param: float = typer.Option(2.0, "--bytes-per-param", min=0.01, help="Roofline: bytes per weight."),
    batch: int = typer.Option(256, "--batch", min=1, help="Rows decoded together (tokens in flight per decode step)."),
    staleness: int = typer.Option(3, "--staleness", min=0, help="Async model: show staleness 1..N."),
    cv: float = typer.Option(
        0.2, "--cv", min=0.0, help="Async model: coefficient of variation of the per-step gen time."
    ),
    async_run: Optional[str] = typer.Option(
        None,
        "--async-run",
        help="Async model on shared cores: gen and train side from this MLflow run, a synchronous run measured with "
        "the share of the machine each side of the pipeline gets (e.g. OMP_NUM_THREADS=half the cores), instead "
        "of the projection's stages (a device per side).",
    ),
    seeds: bool = typer.Option(
        False,
        "--seeds",
        help="Check the step model against docs/design.md §6's published stage times and speedups, and exit (1 on a "
        "failed check).",
    ),
    sweep: Optional[str] = typer.Option(
        None,
        "--sweep",
        help="Check the model on a measured sweep (MLflow sweep name): an alias of "
        "`wb simulate --from-sweep NAME` with its defaults (--calibrate-k 3).",
    ),
    retired: Optional[list[str]] = typer.Option(
        None,
        "--costs",
        "--save-costs",
        "--threads",
        "--reps",
        "--tolerance",
        hidden=True,
        help="Options of the retired step-speedup sweep check.",
    ),
    load_adjust: bool = typer.Option(
        False, "--load-adjust", hidden=True, help="Option of the retired step-speedup sweep check."
    ),
    calibrate: bool = typer.Option(
        False,
        "--calibrate",
        help="Fit the unknown cost (--unknown c|knee) to one measured point (--k K, its acceptance, --gen-speedup S) "
        "and predict k=1..7.",
    ),
    gen_speedup: Optional[float] = typer.Option(
        None,
        "--gen-speedup",
        min=0.0,
        help="--calibrate: the measured gen speedup at --k (e.g. speedup/gen of a paired run).",
    ),
    acceptance_length: Optional[float] = typer.Option(
        None,
        "--acceptance-length",
        min=1.0,
        help="--calibrate: the measured acceptance length at --k (α from inverting E[N]).",
    ),
    unknown: str = typer.Option(
        "c",
        "--unknown",
        help="--calibrate: what to fit: c (drafter/target step cost) or knee (tokens in flight where verification "
        "turns compute-bound).",
    ),
    knee: Optional[float] = typer.Option(
        None,
        "--knee",
        min=1.0,
        help="--calibrate --unknown c: the roofline knee in tokens in flight (default: memory-bound, verification = "
        "1 step).",
    ),
) -> None:
    """Project gen and step speedups per drafter and k, the best k, and async overlap (a performance model).

    Examples: wb project --gen 100 --logprob 20 --train 15 --alpha 0.8 --c 0.05 |
    wb project --run my-run --params 8e9 --batch 64 | wb project --seeds |
    wb project --calibrate --k 3 --acceptance-length 2.4 --gen-speedup 1.6
    """
    from workbench import perf
    from workbench.cli import project_render as render

    if calibrate:
        k_list = _int_list(ks, "--k")  # the one parse of --k (the measured point's k)
        if len(k_list) != 1:
            _fail(f"--calibrate: give the measured point's k as one integer with --k (got {ks!r})")
        if gen_speedup is None:
            _fail(
                "--calibrate: give the measured gen speedup at that k (--gen-speedup S, e.g. speedup/gen of a paired "
                "run)"
            )
        rates, first_alpha, first_c = _floats(per_pos, "--per-pos"), _first(alpha, "--alpha"), _first(c, "--c")
        try:
            a, how = perf.alpha_from_inputs(k_list[0], acceptance_length, rates, first_alpha)
            cal = perf.calibrate.calibrate(
                k_list[0], gen_speedup, a, unknown, first_c, knee, batch, range(1, max(7, k_list[0]) + 1)
            )
        except ValueError as e:
            _fail(str(e))
        return render.calibration(console, cal, how)
    if retired or load_adjust:
        _fail(
            "--costs, --save-costs, --threads, --reps, --tolerance and --load-adjust belonged to the retired "
            "step-speedup check of `wb project --sweep`; the one model-vs-sweep check is `wb simulate --from-sweep "
            "NAME` (see its --help)"
        )
    if sweep:  # the one check of a model against a sweep: wb simulate --from-sweep
        from workbench.cli.simulate_sweep import sweep_check

        console.print(
            f"note: `wb project --sweep` runs `wb simulate --from-sweep {sweep}` (the one model-vs-sweep check)",
            highlight=False,
        )
        return sweep_check(
            sweep,
            3,
            "verify_overhead_s",
            None,
            None,
            None,
            32,
            None,
            None,
            dict(tracking_uri=tracking_uri, experiment="simulate", enabled=True, run_name=f"check {sweep} k=3"),
        )
    if seeds:
        checks = perf.seeds_check()
        render.seeds(console, checks, perf.STEP_SPEEDUP_TOLERANCE)
        if not all(c.ok for c in checks):
            raise typer.Exit(1)
        return

    k_list = list(_int_list(ks, "--k"))  # the one parse of --k (a projection's k values)
    rates = _floats(per_pos, "--per-pos")
    alphas = _named_floats(alpha, "--alpha")
    cvals = _named_floats(c, "--c")
    stages: dict[str, float] = {}
    info: dict = {}
    if run_ref:
        try:
            stages, info = perf.stages_from_mlflow(run_ref, tracking_uri)
        except ValueError as e:
            _fail(str(e))
    cli_stages = dict(gen=gen, logprob=logprob, train=train, prepare=prepare, data=data, other=other)
    for key, v in cli_stages.items():
        if v is not None and (v or key not in stages):
            stages[key] = v
    if stages.get("gen") is None or stages["gen"] <= 0:
        _fail("give the gen stage time (--gen SECONDS) or an MLflow run (--run ID_OR_NAME)")
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
    if cost_curve:
        try:
            cost = perf.load_cost_curve(cost_curve)
        except (OSError, ValueError, KeyError) as e:
            _fail(f"--cost-curve: {e}")
        cost_desc = f"measured curve {cost_curve}"
    elif params:
        cost = perf.CostModel(
            "roofline", params=params, flops=flops, bandwidth=bandwidth, bytes_per_param=bytes_per_param
        )
        cost_desc = f"roofline {params:.3g} params, {flops:.3g} FLOP/s, {bandwidth:.3g} B/s"
    else:
        cost = perf.CostModel()
        cost_desc = "memory-bound (verification = 1 target step)"
    rows = perf.project(stages, alphas, cs, k_list, cost, batch)
    best = perf.best_per_drafter(rows)
    gen_a, side_a, where = stages["gen"], sum(stages.values()) - stages["gen"], "a device per side"
    spec_gens = {d: r.gen_s for d, r in best.items()}
    if async_run:  # worker and trainer share the machine: each side's stage times on its share of it
        try:
            shared, _ = perf.stages_from_mlflow(async_run, tracking_uri)
        except ValueError as e:
            _fail(f"--async-run: {e}")
        gen_a, side_a, where = (
            shared["gen"],
            sum(shared.values()) - shared["gen"],
            f"shared cores, stages of run {async_run}",
        )
        # each drafter's gen speedup, carried over
        spec_gens = {d: g * gen_a / stages["gen"] for d, g in spec_gens.items()}
    overlap = perf.async_overlap(gen_a, side_a, spec_gens, staleness, cv)
    render.projection(console, stages, cost_desc, batch, rows, best, overlap, cv, async_sides=(gen_a, side_a, where))


def _floats(text: str | None, what: str) -> list[float] | None:
    """'0.8,0.6' -> [0.8, 0.6]; None when not given."""
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        _fail(f"{what}: {text!r} is not comma-separated numbers")


def _first(values: list[str] | None, what: str) -> float | None:
    """--calibrate takes one value of a repeatable NAME=value option (the first; the name is ignored)."""
    return next(iter(_named_floats(values[:1], what).values()), None) if values else None
