"""`wb simulate`: project speculative and asynchronous RL to a cluster (parse -> workbench.simulate -> Rich)."""

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
    scenario: str = typer.Argument(..., help="Scenario YAML, or a name under experiments/scenarios/ (qwen3-8b-gb200)."),
    items: Optional[list[str]] = typer.Argument(None, help="KEY=VALUE overrides (dotted keys; aliases k, gpus, staleness, tp); "
                                                "KEY=A,B or KEY=LOW..HIGH sweep that key."),
    sweep: Optional[list[str]] = typer.Option(None, "--sweep", help="Sweep axis KEY=A,B or KEY=LOW..HIGH (repeatable; more axes may follow as arguments)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write every row (inputs, stage seconds, speedups, errors vs reference) as JSON."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a plot: gen speedup vs k, e2e speedup vs GPUs and staleness."),
) -> None:
    """Project rollout, step and end-to-end speedups of speculative decoding (and async RL) on a cluster.

    Examples: wb simulate qwen3-8b-gb200 |
    wb simulate experiments/scenarios/qwen3-235b-gb200.yaml --sweep gpus=512,2048 staleness=0,1,2 k=3,5 |
    wb simulate qwen3-8b-gb200 hardware.preset=h100-sxm k=1..7 --plot k.png
    """
    from workbench.simulate import load_scenario, run
    from workbench.specs import SpecError

    args = [*(sweep or []), *(items or [])]
    overrides = [a for a in args if not _is_axis(a)]
    axes = [a for a in args if _is_axis(a)]
    try:
        raw, base = load_scenario(scenario, [_unalias(o) for o in overrides])
        with console.status("simulating") as st:
            fit, rows = run(raw, base, axes, progress=lambda m: st.update(f"simulating {m}"))
    except (SpecError, ValueError) as e:
        _fail(str(e))
    if fit:
        console.print(f"calibrated [bold]{fit.key}[/] = {fit.value:.4g} on {fit.variant or 'the base'} ({fit.arm} gen "
                      f"{fit.measured_gen_s:g} s); everything else below is predicted", highlight=False)
    table = Table(title=f"wb simulate {base.name}")
    for col in ("variant", "point", "GPUs", "k", "E[N]", "gen AR s", "gen spec s", "rollout ×", "step AR s", "step spec s",
                "step ×", "stale", "e2e ×", "best k"):
        table.add_column(col, justify="left" if col in ("variant", "point") else "right")
    for r in rows:
        x = r.result
        table.add_row(r.variant, " ".join(f"{k.split('.')[-1]}={v}" for k, v in r.point.items()), str(x.gpus), str(x.k),
                      f"{x.acceptance_length:.2f}", f"{x.gen_ar:.1f}", f"{x.gen_spec:.1f}", f"{x.gen_speedup:.2f}",
                      f"{x.step_ar:.1f}", f"{x.step_spec:.1f}", f"{x.step_speedup:.2f}", str(x.staleness), f"{x.e2e_speedup:.2f}",
                      str(x.best_k or "-"))
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
    if json_out:
        rec = {"scenario": base.name, "overrides": overrides, "sweep": axes,
               "calibration": fit.__dict__ if fit else None, "rows": [r.record() for r in rows]}
        json_out.write_text(json.dumps(rec, indent=1))
        console.print(f"wrote {json_out}")
    if plot:
        from workbench.simulate.plots import plot_rows

        console.print(f"wrote {plot_rows(rows, plot)}")


def _is_axis(item: str) -> bool:
    """KEY=A,B or KEY=LOW..HIGH (a sweep axis); KEY=VALUE and KEY=[..] are overrides."""
    value = item.split("=", 1)[1] if "=" in item else ""
    return not value.startswith(("[", "{")) and ("," in value or ".." in value)


def _unalias(item: str) -> str:
    from workbench.simulate import ALIASES

    key, _, value = item.partition("=")
    return f"{ALIASES.get(key, key)}={value}"
