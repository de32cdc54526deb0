"""`wb simulate --from-sweep NAME`: the simulator checked on a measured sweep (parse -> workbench.report.target.resolve
-> workbench.perf.simulate.cpu -> Rich)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from rich.table import Table

from workbench.cli.common import _fail, console


def sweep_check(
    name: str,
    calibrate_k: int,
    unknown: str,
    costs: Optional[Path],
    save_costs: Optional[Path],
    prompt_len: Optional[int],
    draws: int,
    json_out: Optional[Path],
    plot: Optional[Path],
    track: dict,
) -> None:
    """Read the sweep and the measured hardware (bad input: exit 2, no MLflow run), then check inside
    one MLflow run (FAILED if the check raises)."""
    from workbench.perf.simulate.cpu import check
    from workbench.perf.simulate.from_sweep import read_sweep
    from workbench.perf.simulate.measured import MeasuredHardware, from_cache
    from workbench.perf.simulate.plots import plot_check
    from workbench.perf.simulate.record import log_sweep_check, simulate_run
    from workbench.report import ReportError
    from workbench.report.target import resolve

    try:
        with console.status(f"reading sweep {name}"):
            wl = read_sweep(measured_sweep(resolve(name, track["tracking_uri"])), prompt_len)
            hw = (
                MeasuredHardware.load(costs)
                if costs
                else from_cache([(p.params, p.kind, p.k) for p in wl.points], wl.chunk)
            )
    except (ReportError, ValueError) as e:
        _fail(str(e))
    if save_costs:
        console.print(f"wrote {hw.save(save_costs)}")
    try:
        with simulate_run(**track, kind="sweep-check") as tr:
            with console.status("simulating every point"):
                chk = check(wl, hw, calibrate_k, unknown, draws)
            render(chk)
            if json_out:
                json_out.write_text(json.dumps(chk.record(), indent=1))
                console.print(f"wrote {json_out}")
            if plot:
                console.print(f"wrote {plot_check(chk, plot)}")
            log_sweep_check(tr, chk, wl.tracking_uri)
            if tr.active:
                import tempfile

                with tempfile.TemporaryDirectory() as d:
                    tr.log_artifact(plot if plot else plot_check(chk, Path(d) / "plot.png"))
    except ValueError as e:
        _fail(str(e))
    if tr.run_id:
        console.print(f"MLflow run {tr.run_id} ({tr.tracking_uri}, experiment {track['experiment']})", highlight=False)


def measured_sweep(t):
    """The resolved sweep (:class:`workbench.report.target.Target`) as the simulator reads it:
    :class:`workbench.perf.simulate.from_sweep.MeasuredSweep`."""
    from workbench.perf.simulate.from_sweep import MeasuredRow, MeasuredSweep
    from workbench.report.target import row_runs

    rows = [MeasuredRow(r.point.run, row_runs(r), r.gen, r.paired, r.gen_runs) for r in t.rows]
    return MeasuredSweep(t.name, t.tracking_uri, t.runs, rows)


def render(chk) -> None:
    """The fit, the table of points and the count inside their CIs."""
    h = chk.hardware
    how = "batched continuously in {} slots" if chk.workload.get("continuous") else "in batches of {}"
    console.print(
        f"sweep [bold]{chk.sweep}[/]: {chk.workload['rows']} rows per step {how.format(chk.workload['chunk'])}, "
        f"completions {chk.workload['mean_len']:.1f} tokens (cv {chk.workload['cv']:.2f}; "
        f"{chk.workload.get('lengths', 'lognormal fit')}), "
        f"prompts {chk.workload['prompt_len']} tokens; "
        f"hardware: {h.get('source', '?')} ({h.get('machine', '?')}, torch {h.get('torch', '?')}, "
        f"{h.get('threads', '?')} threads)",
        highlight=False,
    )
    fits = ", ".join(f"{k} {v * 1e3:+.3g} ms" for k, v in chk.fits.items())
    console.print(
        f"calibrated [bold]{chk.unknown}[/] per drafter at k={chk.calibrate_k}: {fits}; every other k is predicted",
        highlight=False,
    )
    t = Table(title=f"wb simulate --from-sweep {chk.sweep}: paired gen speedup, measured vs predicted")
    for col in (
        "drafter",
        "k",
        "E[N]",
        "n",
        "measured gen× [95 % CI]",
        "τ",
        "predicted",
        "inside",
        "error",
        "miss",
        "counted model",
    ):
        t.add_column(col, justify="left" if col == "drafter" else "right")
    for r in chk.rows:
        tau = "-" if r.tau is None else f"{math.expm1(r.tau):.1%}"
        t.add_row(
            r.kind,
            str(r.k),
            f"{r.acceptance_length:.2f}",
            str(r.runs),
            f"{r.measured:.3f} [{r.low:.3f}, {r.high:.3f}]",
            tau,
            f"{r.predicted:.3f}",
            "calib." if r.calibration else ("✓" if r.inside else "✗"),
            f"{r.error:+.1%}",
            f"{r.miss:+.1%}" if r.miss else "-",
            f"{r.modeled:.3f}" if r.modeled is not None else "-",
        )
    console.print(t)
    pred = chk.predicted_rows
    misses = sorted(abs(r.miss) for r in pred if not r.inside)
    tail = (
        f"; the others miss their CI by {misses[len(misses) // 2]:.1%} (median), {misses[-1]:.1%} at most"
        if misses
        else ""
    )
    console.print(
        f"{sum(r.inside for r in pred)}/{len(pred)} predicted points inside their 95 % CI{tail}. n: runs (seeds); n "
        "≥ 2: random-effects CI over them (runs_ci), τ their between-run spread; n = 1: the run's per-step CI. "
        "counted model: the runs' own speedup/gen_modeled (counted forwards × the same curves, no unknown).",
        highlight=False,
    )
    for n in chk.notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
