"""`wb simulate`: project speculative and asynchronous RL to a cluster (parse -> workbench.perf.simulate -> Rich)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from workbench.cli.common import _fail, app, console


def _pct(x: float) -> str:
    return f"{x:+.1%}"


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
    unknown: str = typer.Option(
        "verify_overhead_s", "--unknown", help="--from-sweep: verify_overhead_s | step_overhead_s | draft_overhead_s."
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
    experiment: str = typer.Option("simulate", "--experiment", help="MLflow experiment of the simulate run."),
    run_name: Optional[str] = typer.Option(None, "--run-name", help="MLflow run name."),
    no_track: bool = typer.Option(False, "--no-track", help="Log no MLflow run."),
) -> None:
    """Project rollout, step and end-to-end speedups of speculative decoding (and async RL) on a cluster,
    or check the model on a measured sweep (--from-sweep). Each call is one MLflow run (tag workbench.simulate=true).

    Examples: wb simulate qwen3-8b-gb200 |
    wb simulate experiments/scenarios/qwen3-235b-gb200.yaml --sweep gpus=512,2048 staleness=0,1,2 k=3,5 |
    wb simulate qwen3-8b-gb200 hardware.preset=h100-sxm k=1..7 --plot k.png |
    wb simulate --from-sweep membound-k --calibrate-k 3
    """
    from workbench.perf.simulate.record import simulate_run

    track = dict(tracking_uri=tracking_uri, experiment=experiment, enabled=not no_track)
    if from_sweep:
        if scenario or items or sweep:
            _fail("--from-sweep checks a measured sweep: give no scenario, overrides or --sweep with it")
        from workbench.cli.simulate_sweep import sweep_check

        sweep_check(
            from_sweep,
            calibrate_k,
            unknown,
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
        _fail("give a scenario (a YAML file or a name under experiments/scenarios/), or --from-sweep NAME")
    from workbench.perf.simulate import load_scenario, run
    from workbench.specs import SpecError

    args = [*(sweep or []), *(items or [])]
    overrides = [a for a in args if not _is_axis(a)]
    axes = [a for a in args if _is_axis(a)]
    try:
        raw, base = load_scenario(scenario, [_unalias(o) for o in overrides])
        _show_run_lengths(base)
    except (SpecError, ValueError) as e:
        _fail(str(e))
    try:
        with simulate_run(**track, run_name=run_name or base.name, kind="scenario") as tr:
            with console.status("simulating") as st:
                fit, rows = run(raw, base, axes, progress=lambda m: st.update(f"simulating {m}"))
            _render(base.name, fit, rows)
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
            _log_plot(tr, plot, lambda p: plot_rows(rows, p))
    except (SpecError, ValueError) as e:
        _fail(str(e))
    if tr.run_id:
        console.print(f"MLflow run {tr.run_id} ({tr.tracking_uri}, experiment {experiment})", highlight=False)


def _show_run_lengths(base) -> None:
    """With ``workload.response.kind=run``: what the run's logged lengths are (raises ValueError if unreadable)."""
    r = base.workload.response
    if r.kind != "run":
        return
    from workbench.perf.simulate.rollout import run_lengths

    m = run_lengths(tuple(r.run), r.tracking_uri)
    n = len(m.source.split(", "))
    console.print(
        f"response lengths: {', '.join(r.run)} ({n} run{'s' if n > 1 else ''}): {m.describe()}"
        + (f"; scaled to mean {r.scale_mean:g}" if r.scale_mean else ""),
        highlight=False,
    )


def _log_plot(tr, plot: Optional[Path], make) -> None:
    """Log ``plot`` (or one made in a temporary folder) as the run's ``plot.png``."""
    if not tr.active:
        return
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = plot if plot else make(Path(d) / "plot.png")
        tr.log_artifact(src)


def _render(name: str, fit, rows) -> None:
    if fit:
        console.print(
            f"calibrated [bold]{fit.key}[/] = {fit.value:.4g} on {fit.variant or 'the base'} ({fit.arm} gen "
            f"{fit.measured_gen_s:g} s); everything else below is predicted",
            highlight=False,
        )
    table = Table(title=f"wb simulate {name}")
    for col in (
        "variant",
        "point",
        "GPUs",
        "k",
        "E[N]",
        "gen AR s",
        "gen spec s",
        "rollout ×",
        "step AR s",
        "step spec s",
        "step ×",
        "stale",
        "e2e ×",
        "best k",
    ):
        table.add_column(col, justify="left" if col in ("variant", "point") else "right")
    for r in rows:
        x = r.result
        table.add_row(
            r.variant,
            " ".join(f"{k.split('.')[-1]}={v}" for k, v in r.point.items()),
            str(x.gpus),
            str(x.k),
            f"{x.acceptance_length:.2f}",
            f"{x.gen_ar:.1f}",
            f"{x.gen_spec:.1f}",
            f"{x.gen_speedup:.2f}",
            f"{x.step_ar:.1f}",
            f"{x.step_spec:.1f}",
            f"{x.step_speedup:.2f}",
            str(x.staleness),
            f"{x.e2e_speedup:.2f}",
            str(x.best_k or "-"),
        )
    console.print(table)
    refs = [r for r in rows if r.errors]
    if refs:
        t = Table(title="predicted vs reference")
        for col in ("variant", "quantity", "predicted", "reference", "error"):
            t.add_column(col, justify="left" if col in ("variant", "quantity") else "right")
        for r in refs:
            label = " ".join([r.variant, *(f"{k.split('.')[-1]}={v}" for k, v in r.point.items())])
            for n, (p, ref, e) in r.errors.items():
                t.add_row(label, n, f"{p:.2f}", f"{ref:.2f}", _pct(e))
        console.print(t)


def _is_axis(item: str) -> bool:
    """KEY=A,B or KEY=LOW..HIGH (a sweep axis); KEY=VALUE and KEY=[..] are overrides."""
    value = item.split("=", 1)[1] if "=" in item else ""
    return not value.startswith(("[", "{")) and ("," in value or ".." in value)


def _unalias(item: str) -> str:
    from workbench.perf.simulate import ALIASES

    key, _, value = item.partition("=")
    return f"{ALIASES.get(key, key)}={value}"
