"""Plots of ``wb simulate`` results (matplotlib, Agg): gen speedup vs k, e2e speedup vs GPUs and staleness;
measured vs predicted speedups of a sweep check (``--from-sweep``)."""

from __future__ import annotations

from pathlib import Path

from workbench.figures import save_figure
from workbench.perf.simulate.run import Row


def _plt():
    """pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (format from its suffix), close it, return the path."""
    fig.tight_layout()
    out = save_figure(fig, path, dpi=120)
    plt.close(fig)
    return out


def plot_rows(rows: list[Row], path: str | Path) -> Path:
    """One figure: left, gen speedup vs k per variant (the k scan, or the swept k); right, the e2e
    speedup (sync autoregressive step / step at that staleness with speculation) vs GPUs, one line per
    variant × staleness × k. Written to ``path`` (format from its suffix)."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    curves: dict[str, dict[int, float]] = {}
    for r in rows:
        label = r.variant + "".join(f" {k}={v}" for k, v in r.point.items() if k != "speculation.k")
        if r.result.gen_speedup_by_k:
            curves.setdefault(label, {}).update(r.result.gen_speedup_by_k)
        else:
            curves.setdefault(label, {})[r.result.k] = r.result.gen_speedup
    for label, pts in curves.items():
        ks = sorted(pts)
        a.plot(ks, [pts[k] for k in ks], marker="o", label=label)
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_xlabel("k (draft tokens per verification)")
    a.set_ylabel("gen (rollout) speedup")
    a.legend(fontsize=7)
    lines: dict[str, dict[int, float]] = {}
    for r in rows:
        lines.setdefault(f"{r.variant} s={r.result.staleness} k={r.result.k}", {})[r.result.gpus] = r.result.e2e_speedup
    for label, pts in lines.items():
        g = sorted(pts)
        b.plot(g, [pts[x] for x in g], marker="o", label=label)
    b.set_xscale("log", base=2)
    b.set_xlabel("GPUs")
    b.set_ylabel("e2e speedup vs sync autoregressive")
    b.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_check(chk, path: str | Path) -> Path:
    """``wb simulate --from-sweep``: per drafter, the measured paired gen speedup with its 95 % CI
    (error bars) and the predicted one (line; the calibration k ringed) against k."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, kind in enumerate(dict.fromkeys(r.kind for r in chk.rows)):
        rs = sorted((r for r in chk.rows if r.kind == kind), key=lambda r: r.k)
        c = f"C{i}"
        ks = [r.k for r in rs]
        ax.errorbar(
            ks,
            [r.measured for r in rs],
            yerr=[[r.measured - r.low for r in rs], [r.high - r.measured for r in rs]],
            fmt="o",
            color=c,
            capsize=3,
            label=f"{kind} measured [95 % CI]",
        )
        ax.plot(ks, [r.predicted for r in rs], "-", color=c, label=f"{kind} predicted")
        ax.plot(
            [r.k for r in rs if r.calibration],
            [r.predicted for r in rs if r.calibration],
            "o",
            mfc="none",
            ms=12,
            color=c,
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (draft tokens per verification)")
    ax.set_ylabel("gen speedup (paired)")
    ax.set_title(f"{chk.sweep}: {chk.unknown} fitted at k={chk.calibrate_k} (ringed)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)
