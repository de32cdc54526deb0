"""`wb simulate`: project speculative and asynchronous RL to a cluster (parse -> workbench.perf.simulate -> Rich)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from workbench.cli.common import _fail, app, console
from workbench.cli.simulate_render import log_plot, render, show_run_lengths


@app.command()
def simulate(
    scenario: Optional[str] = typer.Argument(
        None, help="Scenario YAML, or a name under experiments/scenarios/ (qwen3-8b-gb200); omit with --from-sweep."
    ),
    items: Optional[list[str]] = typer.Argument(
        None,
        help="KEY=VALUE overrides (dotted keys; aliases k, gpus, staleness, tp); "
        "KEY=A,B or KEY=LOW..HIGH sweep that key.",
    ),
    sweep: Optional[list[str]] = typer.Option(
        None, "--sweep", help="Sweep axis KEY=A,B or KEY=LOW..HIGH (repeatable; more axes may follow as arguments)."
    ),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="Write every row (inputs, stage seconds, speedups, errors vs reference) as JSON."
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Write a plot: gen speedup vs k, e2e speedup vs GPUs and staleness."
    ),
    from_sweep: Optional[str] = typer.Option(
        None,
        "--from-sweep",
        help="Check the model on a workbench sweep in MLflow instead: this "
        "machine's measured cost curves as the hardware, the sweep's acceptance and lengths as the "
        "workload; one unknown fitted per drafter at --calibrate-k, every other k predicted.",
    ),
    calibrate_k: int = typer.Option(
        3, "--calibrate-k", min=1, help="--from-sweep: the k whose measured paired gen speedup fits the unknown."
    ),
    unknown: Optional[str] = typer.Option(
        None,
        "--unknown",
        help="What is fitted: --from-sweep: verify_overhead_s (default) | step_overhead_s | draft_overhead_s; "
        "--calibrate: c (default, drafter/target step cost) | knee (tokens in flight where verification turns "
        "compute-bound).",
    ),
    costs: Optional[Path] = typer.Option(
        None,
        "--costs",
        help="--from-sweep: measured-hardware JSON (--save-costs) instead of the local cost-curve cache.",
    ),
    save_costs: Optional[Path] = typer.Option(
        None, "--save-costs", help="--from-sweep: write the measured hardware used as JSON."
    ),
    prompt_len: Optional[int] = typer.Option(
        None, "--prompt-len", min=1, help="--from-sweep: prompt tokens (default: from the task's prompts)."
    ),
    draws: int = typer.Option(
        32, "--draws", min=1, help="--from-sweep: GRPO steps of lengths and acceptance drawn (fixed seed)."
    ),
    tracking_uri: Optional[str] = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store read (--from-sweep) and written (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db).",
    ),
    gen: Optional[float] = typer.Option(
        None,
        "--gen",
        help="Seconds of the gen stage per step (autoregressive).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    logprob: float = typer.Option(
        0.0,
        "--logprob",
        min=0.0,
        help="Seconds of the logprob stage.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    train: float = typer.Option(
        0.0,
        "--train",
        min=0.0,
        help="Seconds of the train stage.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    prepare: float = typer.Option(
        0.0,
        "--prepare",
        min=0.0,
        help="Seconds of the prepare stage (weight sync).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    data: float = typer.Option(
        0.0,
        "--data",
        min=0.0,
        help="Seconds of the data stage.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    other: float = typer.Option(
        0.0,
        "--other",
        min=0.0,
        help="Other seconds per step (draft_train, reward, untimed).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    from_run: Optional[str] = typer.Option(
        None,
        "--from-run",
        help="MLflow run id or name: stage times = mean timing_s/<stage>, α from spec/acceptance_rate_pos_<i>.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    alpha: Optional[list[str]] = typer.Option(
        None,
        "--alpha",
        help="Per-token acceptance α, or DRAFTER=α (repeatable).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    per_pos: Optional[str] = typer.Option(
        None,
        "--per-pos",
        help="Per-position acceptance rates 'r0,r1,..' (α fitted from r_i ≈ α^(i+1)).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    c: Optional[list[str]] = typer.Option(
        None,
        "--c",
        help="Drafter/target step cost ratio, or DRAFTER=c (repeatable; default 0.05).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    ks: Optional[str] = typer.Option(
        None,
        "--k",
        help="Speculation lengths LOW..HIGH or a,b,c (default 1..8); --calibrate: the measured point's k. A "
        "scenario takes k=... as an argument.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    cost_curve: Optional[str] = typer.Option(
        None,
        "--cost-curve",
        help="JSON/CSV of target forward seconds vs tokens in flight.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    params: Optional[float] = typer.Option(
        None,
        "--params",
        help="Roofline: target parameter count (e.g. 8e9).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    flops: float = typer.Option(
        989e12,
        "--flops",
        min=1.0,
        help="Roofline: GPU FLOP/s (default H100 dense bf16).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    bandwidth: float = typer.Option(
        3.35e12,
        "--bandwidth",
        min=1.0,
        help="Roofline: GPU memory bandwidth, bytes/s (default H100).",
        rich_help_panel="From stage times (the analytic model)",
    ),  # fmt: skip
    bytes_per_param: float = typer.Option(
        2.0,
        "--bytes-per-param",
        min=0.01,
        help="Roofline: bytes per weight.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    batch: int = typer.Option(
        256,
        "--batch",
        min=1,
        help="Rows decoded together (tokens in flight per decode step).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    staleness: int = typer.Option(
        3,
        "--staleness",
        min=0,
        help="Async model: show staleness 1..N.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    cv: float = typer.Option(
        0.2,
        "--cv",
        min=0.0,
        help="Async model: coefficient of variation of the per-step gen time.",
        rich_help_panel="From stage times (the analytic model)",
    ),  # fmt: skip
    async_run: Optional[str] = typer.Option(
        None,
        "--async-run",
        help="Async model on shared cores: gen and train side from this MLflow run, a synchronous run measured with "
        "the share of the machine each side of the pipeline gets (e.g. OMP_NUM_THREADS=half the cores), instead "
        "of the projection's stages (a device per side).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    published: bool = typer.Option(
        False,
        "--published",
        help="Check the step model against docs/design.md §6's published stage times and speedups, and exit (1 on a "
        "failed check).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    calibrate: bool = typer.Option(
        False,
        "--calibrate",
        help="Fit the unknown cost (--unknown c|knee) to one measured point (--k K, its acceptance, --gen-speedup S) "
        "and predict k=1..7.",
        rich_help_panel="From stage times (the analytic model)",
    ),
    gen_speedup: Optional[float] = typer.Option(
        None,
        "--gen-speedup",
        min=0.0,
        help="--calibrate: the measured gen speedup at --k (e.g. speedup/gen of a paired run).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    acceptance_length: Optional[float] = typer.Option(
        None,
        "--acceptance-length",
        min=1.0,
        help="--calibrate: the measured acceptance length at --k (α from inverting E[N]).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    knee: Optional[float] = typer.Option(
        None,
        "--knee",
        min=1.0,
        help="--calibrate --unknown c: the roofline knee in tokens in flight (default: memory-bound, verification = "
        "1 step).",
        rich_help_panel="From stage times (the analytic model)",
    ),
    experiment: str = typer.Option("simulate", "--experiment", help="MLflow experiment of the simulate run."),
    run_name: Optional[str] = typer.Option(None, "--run-name", help="MLflow run name."),
    no_track: bool = typer.Option(False, "--no-track", help="Log no MLflow run."),
) -> None:
    """Project rollout, step and end-to-end speedups of speculative decoding (and async RL) on a cluster,
    or check the model on a measured sweep (--from-sweep): each such call is one MLflow run (tag
    workbench.simulate=true). From stage times (--gen ... or --from-run RUN; --published; --calibrate): the
    analytic model, gen and step speedups per drafter and k and async overlap, logged nowhere.

    Examples: wb simulate qwen3-8b-gb200 |
    wb simulate experiments/scenarios/qwen3-235b-gb200.yaml --sweep gpus=512,2048 staleness=0,1,2 k=3,5 |
    wb simulate qwen3-8b-gb200 hardware.preset=h100-sxm k=1..7 --plot k.png |
    wb simulate --from-sweep membound-k --calibrate-k 3 |
    wb simulate --gen 100 --logprob 20 --train 15 --alpha 0.8 --c 0.05 | wb simulate --from-run my-run --params 8e9 |
    wb simulate --published | wb simulate --calibrate --k 3 --acceptance-length 2.4 --gen-speedup 1.6
    """
    from workbench.cli import simulate_stages as stages_mode

    st = stages_mode.StageInputs(
        gen=gen,
        logprob=logprob,
        train=train,
        prepare=prepare,
        data=data,
        other=other,
        from_run=from_run,
        tracking_uri=tracking_uri,
        alpha=alpha,
        per_pos=per_pos,
        c=c,
        ks=ks,
        cost_curve=cost_curve,
        params=params,
        flops=flops,
        bandwidth=bandwidth,
        bytes_per_param=bytes_per_param,
        batch=batch,
        staleness=staleness,
        cv=cv,
        async_run=async_run,
    )
    if calibrate or published or st.given():
        if scenario or items or sweep or from_sweep:
            _fail("stage times, --published and --calibrate use the analytic model: give no scenario or --from-sweep")
        if calibrate:
            return stages_mode.calibration(st, gen_speedup, acceptance_length, unknown or "c", knee)
        return stages_mode.published() if published else stages_mode.projection(st)
    if ks is not None:
        _fail("--k is for the analytic model (--gen, --from-run, --calibrate); a scenario takes k=1..7 as an argument")
    from workbench.perf.simulate.record import simulate_run

    track = dict(tracking_uri=tracking_uri, experiment=experiment, enabled=not no_track)
    if from_sweep:
        if scenario or items or sweep:
            _fail("--from-sweep checks a measured sweep: give no scenario, overrides or --sweep with it")
        from workbench.cli.simulate_sweep import sweep_check

        sweep_check(
            from_sweep,
            calibrate_k,
            unknown or "verify_overhead_s",
            costs,
            save_costs,
            prompt_len,
            draws,
            json_out,
            plot,
            dict(track, run_name=run_name or f"check {from_sweep} k={calibrate_k}"),
        )
        return
    if scenario is None:
        _fail(
            "give a scenario (a YAML file or a name under experiments/scenarios/), --from-sweep NAME, or stage "
            "times (--gen SECONDS or --from-run RUN)"
        )
    from workbench.perf.simulate import load_scenario, run
    from workbench.specs import SpecError

    args = [*(sweep or []), *(items or [])]
    overrides = [a for a in args if not _is_axis(a)]
    axes = [a for a in args if _is_axis(a)]
    try:
        raw, base = load_scenario(scenario, [_unalias(o) for o in overrides])
        show_run_lengths(base)
    except (SpecError, ValueError) as e:
        _fail(str(e))
    try:
        with simulate_run(**track, run_name=run_name or base.name, kind="scenario") as tr:
            with console.status("simulating") as st:
                fit, rows = run(raw, base, axes, progress=lambda m: st.update(f"simulating {m}"))
            render(base.name, fit, rows)
            rec = {
                "scenario": base.name,
                "overrides": overrides,
                "sweep": axes,
                "calibration": fit.__dict__ if fit else None,
                "rows": [r.record() for r in rows],
            }
            if json_out:
                json_out.write_text(json.dumps(rec, indent=1))
                console.print(f"wrote {json_out}")
            from workbench.perf.simulate.plots import plot_rows
            from workbench.perf.simulate.record import log_scenario

            if plot:
                console.print(f"wrote {plot_rows(rows, plot)}")
            log_scenario(tr, raw, overrides, axes, fit, rows, rec)
            log_plot(tr, plot, lambda p: plot_rows(rows, p))
    except (SpecError, ValueError) as e:
        _fail(str(e))
    if tr.run_id:
        console.print(f"MLflow run {tr.run_id} ({tr.tracking_uri}, experiment {experiment})", highlight=False)


def _is_axis(item: str) -> bool:
    """KEY=A,B or KEY=LOW..HIGH (a sweep axis); KEY=VALUE and KEY=[..] are overrides."""
    value = item.split("=", 1)[1] if "=" in item else ""
    return not value.startswith(("[", "{")) and ("," in value or ".." in value)


def _unalias(item: str) -> str:
    from workbench.perf.simulate import ALIASES

    key, _, value = item.partition("=")
    return f"{ALIASES.get(key, key)}={value}"
