"""The sweep parent run's ``speedup_vs_k.png``: k against the paired speedup, one line per drafter kind.

Why a picture and not a link: ``wb ui`` opens MLflow's compare-runs page, whose URL takes only
``runs`` and ``experiments`` (MLflow 3.x's ``CompareRunPage`` reads nothing else); its scatter plot
starts on the first param against the first metric and keeps the chosen axes in page state, with no
URL parameter to preselect them. So the sweep draws k against ``speedup/gen`` itself (the rows'
pooled paired speedups with their 95 % intervals, as in its results table) and logs the figure on
the parent run, where the MLflow UI shows it under Artifacts. ``wb report`` draws the same plot
from the store (:mod:`workbench.report.plots`).
"""

from __future__ import annotations

from pathlib import Path

from workbench.figures import save_figure
from workbench.stats import RatioCI
from workbench.sweep.grid import ALIAS_OF, REPEAT_KEY
from workbench.sweep.results import Row

PLOT_NAME = "speedup_vs_k.png"
SKIP_AXES = ("drafter.kind", "drafter.k", REPEAT_KEY)  # kind names the line, k is the x axis, seeds are pooled


def speedup_lines(rows: list[Row], attr: str = "gen") -> dict[str, list[tuple[int, RatioCI, bool]]]:
    """Speculative rows with a speedup, as lines ``name -> [(k, interval, paired)]`` sorted by k.

    ``attr``: ``gen`` (``speedup/gen``) or ``step`` (``speedup/step``). A line's name is the drafter
    kind and any other axis values (``draft_model lr=0.01``); baselines and rows without one are left out.
    """
    lines: dict[str, list[tuple[int, RatioCI, bool]]] = {}
    for r in rows:
        ci = getattr(r, attr)
        if r.point.is_baseline or ci is None:
            continue
        p = r.point
        name = p.spec.drafter.kind + "".join(
            f" {ALIAS_OF.get(k, k)}={v}" for k, v in p.assignment.items() if k not in SKIP_AXES
        )
        lines.setdefault(name, []).append((p.spec.drafter.k, ci, r.paired))
    return {n: sorted(pts, key=lambda x: x[0]) for n, pts in sorted(lines.items())}


def speedup_vs_k_png(rows: list[Row], path: Path, title: str = "") -> Path | None:
    """Draw gen (left) and whole-step (right) speedup against k with 95 % CI error bars into ``path``;
    None (nothing written) with fewer than 2 speculative points (one point is no curve)."""
    gen = speedup_lines(rows, "gen")
    if sum(len(v) for v in gen.values()) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 2, figsize=(10, 4))
    for ax, attr, what in (
        (axs[0], "gen", "speedup/gen (gen stage)"),
        (axs[1], "step", "speedup/step (whole RL step)"),
    ):
        for name, pts in speedup_lines(rows, attr).items():
            cis = [ci for _, ci, _ in pts]
            err = [
                [c.mean - c.low if c.low is not None else 0.0 for c in cis],
                [c.high - c.mean if c.high is not None else 0.0 for c in cis],
            ]
            paired = all(p for _, _, p in pts)
            ax.errorbar(
                [k for k, _, _ in pts],
                [c.mean for c in cis],
                yerr=err,
                fmt="o-" if paired else "o--",
                capsize=3,
                label=name + ("" if paired else " (~ unpaired, no CI)"),
            )
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="autoregressive (1×)")
        ax.set_xlabel("k (draft tokens per verification step)")
        ax.set_ylabel("speedup (autoregressive s / speculative s)")
        ax.set_title(f"{what}" + (f": {title}" if title else ""), fontsize=10)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
