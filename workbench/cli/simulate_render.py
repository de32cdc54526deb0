"""What `wb simulate` prints of a scenario run: the rows, the calibration, the reference errors, the run lengths
read (Rich)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.table import Table

from workbench.cli.common import console


def pct(x: float) -> str:
    return f"{x:+.1%}"


def show_run_lengths(base) -> None:
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


def log_plot(tr, plot: Optional[Path], make) -> None:
    """Log ``plot`` (or one made in a temporary folder) as the run's ``plot.png``."""
    if not tr.active:
        return
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = plot if plot else make(Path(d) / "plot.png")
        tr.log_artifact(src)


def render(name: str, fit, rows) -> None:
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
                t.add_row(label, n, f"{p:.2f}", f"{ref:.2f}", pct(e))
        console.print(t)
