"""Plots of ``wb simulate`` results (matplotlib, Agg): gen speedup vs k, e2e speedup vs GPUs and staleness."""

from __future__ import annotations

from pathlib import Path

from workbench.simulate.run import Row


def plot_rows(rows: list[Row], path: str | Path) -> Path:
    """One figure: left, gen speedup vs k per variant (the k scan, or the swept k); right, the e2e
    speedup (sync autoregressive step / step at that staleness with speculation) vs GPUs, one line per
    variant × staleness × k. Written to ``path`` (format from its suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
