"""`wb report`'s PNG plots (matplotlib, Agg). Each takes the resolved :class:`workbench.report.Target`
and an output folder and returns the file name, or None when there is no data for it.

- speedup vs k per drafter kind (and other axes), gen stage and whole step, 95 % CI error bars;
- acceptance rate per draft position (row means after warm-up);
- acceptance length over RL steps per run (drafter staleness; online vs frozen told apart by the
  ``drafter.online.enabled`` param when present);
- stage times of the autoregressive baseline vs the top speculative row;
- reward curves per run, with a mean ± sd band per drafter kind that has several runs (seeds);
- adaptive speculation: the histogram of chosen k and chosen k against the live batch size.
"""

from __future__ import annotations

import math
from pathlib import Path

from workbench import metrics as M
from workbench.figures import save_figure
from workbench.report.tables import REWARD, reward_groups, stage_rows
from workbench.report.target import Target, label, online, row_mean, row_runs, short
from workbench.sweep.results import REPEAT_KEY


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    _plt().close(fig)
    return path.name


def _finish(ax, xlabel: str, ylabel: str, title: str, integer_x: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if integer_x:
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_speedup_vs_k(t: Target, out: Path) -> str | None:
    rows = [r for r in t.rows if not r.point.is_baseline and r.point.run.k is not None and r.gen is not None]
    if len(rows) < 2:  # one point (e.g. a single run) is no curve
        return None
    plt = _plt()
    fig, axs = plt.subplots(1, 2, figsize=(10, 4))
    other = [a for a in t.axes if a not in ("drafter.kind", "drafter.k", REPEAT_KEY)]
    groups: dict[str, list] = {}
    for r in rows:
        run = r.point.run
        key = run.kind + "".join(
            f" {short(a)}={run.tags.get('workbench.axis.' + a) or run.params.get(a)}" for a in other
        )
        groups.setdefault(key, []).append(r)
    for ax, attr, title in ((axs[0], "gen", "generation (gen stage)"), (axs[1], "step", "whole RL step")):
        for name, rs in sorted(groups.items()):
            rs = sorted((r for r in rs if getattr(r, attr) is not None), key=lambda r: r.point.run.k)
            if not rs:
                continue
            cis = [getattr(r, attr) for r in rs]
            means = [c.mean for c in cis]
            err = [
                [c.mean - c.low if c.low is not None else 0.0 for c in cis],
                [c.high - c.mean if c.high is not None else 0.0 for c in cis],
            ]
            paired = all(r.paired for r in rs)
            ax.errorbar(
                [r.point.run.k for r in rs],
                means,
                yerr=err,
                fmt="o-" if paired else "o--",
                capsize=3,
                label=name + ("" if paired else " (~ unpaired, no CI)"),
            )
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="autoregressive (1×)")
        _finish(
            ax,
            "k (draft tokens per verification step)",
            "speedup (autoregressive s / speculative s)",
            f"speedup vs k: {title}",
        )
    return _save(fig, out / "speedup_vs_k.png")


def plot_acceptance_per_position(t: Target, out: Path) -> str | None:
    lines = []
    for r in t.rows:
        keys = {k for x in row_runs(r) for k in x.history if k.startswith(M.ACCEPTANCE_RATE_POS)}
        pos = sorted((M.suffix_int(k, M.ACCEPTANCE_RATE_POS), row_mean(r, k)) for k in keys)
        pos = [(i, v) for i, v in pos if v is not None]
        if pos:
            lines.append((r, pos))
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, pos in lines:
        ax.plot([i for i, _ in pos], [v for _, v in pos], "o-", label=label(r))
    ax.set_ylim(0, 1.02)
    _finish(
        ax,
        "draft position i (0 = first draft token)",
        "acceptance rate at position i",
        "per-position acceptance (mean after warm-up)",
    )
    return _save(fig, out / "acceptance_per_position.png")


def _mean_sd_by_step(series: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float]]:
    """Per step, the mean and sample sd of several runs' (step, value) series (sd 0 where one run has it)."""
    by: dict[int, list[float]] = {}
    for pts in series:
        for s, v in pts:
            by.setdefault(s, []).append(v)
    steps = sorted(by)
    mean = [sum(by[s]) / len(by[s]) for s in steps]
    sd = [
        math.sqrt(sum((v - m) ** 2 for v in by[s]) / (len(by[s]) - 1)) if len(by[s]) > 1 else 0.0
        for s, m in zip(steps, mean)
    ]
    return steps, mean, sd


def plot_acceptance_over_steps(t: Target, out: Path) -> str | None:
    """Acceptance length per RL step: one line per run, or, where a row (an arm: frozen or online drafter)
    has several runs (seeds), their mean with a ± sd band (drafter staleness: docs/results/staleness.md)."""
    lines = [(r, x) for r in t.rows for x in row_runs(r, ok=False) if x.history.get(M.ACCEPTANCE_LENGTH)]
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    cmap = plt.get_cmap("tab10")
    arms: dict[tuple[str, bool | None], list] = {}
    for r, x in lines:
        arms.setdefault((label(r), online(x)), []).append(x)
    for i, ((name, mode), runs) in enumerate(arms.items()):
        tag = {True: " (online)", False: " (frozen)", None: ""}[mode]
        style, color = "--" if mode is False else "-", cmap(i % 10)
        if len(runs) == 1:
            pts = runs[0].history[M.ACCEPTANCE_LENGTH]
            ax.plot([s for s, _ in pts], [v for _, v in pts], style, color=color, marker="o", ms=3, label=name + tag)
            continue
        steps, mean, sd = _mean_sd_by_step([x.history[M.ACCEPTANCE_LENGTH] for x in runs])
        ax.plot(steps, mean, style, color=color, lw=2, label=f"{name}{tag} ({len(runs)} runs, mean ± sd)")
        ax.fill_between(
            steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)], color=color, alpha=0.15
        )
    _finish(
        ax,
        "RL step",
        "acceptance length (tokens / verification)",
        "acceptance length over training (drafter staleness)",
    )
    return _save(fig, out / "acceptance_length_steps.png")


def plot_stage_times(t: Target, out: Path) -> str | None:
    shown, lines = stage_rows(t)
    if not shown or all(v is None for v in lines[-1][1]):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.9 * len(shown)))
    names = [label(r) for r in shown]
    left = [0.0] * len(shown)
    cmap = plt.get_cmap("tab10")
    for i, (stage, vals) in enumerate(lines[:-1]):
        v = [x or 0.0 for x in vals]
        ax.barh(names, v, left=left, color=cmap(i % 10), label=stage)
        left = [a + b for a, b in zip(left, v)]
    for y, (tot, r) in enumerate(zip(lines[-1][1], shown)):
        if tot is not None:
            step = f"  ({'' if r.paired else '~'}{r.step.mean:.2f}× step)" if r.step is not None else ""
            ax.text(max(tot, left[y]), y, f" {tot:.3f} s{step}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per RL step (mean after warm-up)")
    ax.set_title("where a step's time goes")
    ax.set_xlim(0, max(left + [x or 0 for x in lines[-1][1]]) * 1.35 or 1)
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    return _save(fig, out / "stage_times.png")


def plot_rewards(t: Target, out: Path) -> str | None:
    groups = reward_groups(t)
    if not groups:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    cmap = plt.get_cmap("tab10")
    for i, (kind, rs) in enumerate(groups.items()):
        ar = kind.startswith("none")
        name = kind.replace("none", "autoregressive", 1) if ar else kind
        color = "black" if kind in ("none", "none (workbench)") else cmap(i % 10)
        many = len(rs) > 1
        for j, r in enumerate(rs):
            pts = r.history[REWARD]
            ax.plot(
                [s for s, _ in pts],
                [v for _, v in pts],
                color=color,
                lw=0.8 if many else 1.6,
                alpha=0.35 if many else 1.0,
                ls="-" if ar else "--",
                marker=None if many else "o",
                ms=3,
                label=None if many else f"{name} (1 run)",
            )
        if many:  # mean ± sd across the kind's runs, per step
            steps, mean, sd = _mean_sd_by_step([r.history[REWARD] for r in rs])
            ax.plot(steps, mean, color=color, lw=2.2, label=f"{name} ({len(rs)} runs, mean ± sd)")
            ax.fill_between(
                steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)], color=color, alpha=0.15
            )
    title = (
        "reward per drafter and rollout backend (should overlap: same law)"
        if any(" (" in g for g in groups)
        else "reward with and without speculation (should overlap: training unchanged)"
    )
    _finish(ax, "RL step", REWARD, title)
    return _save(fig, out / "reward_curves.png")


def plot_k_histogram(t: Target, out: Path) -> str | None:
    """Adaptive speculation: the share of verification steps at each chosen k_t, per row."""
    bars = []
    for r in t.rows:
        keys = sorted(
            {k for x in row_runs(r) for k in x.history if k.startswith(M.K_FRAC)},
            key=lambda k: M.suffix_int(k, M.K_FRAC),
        )
        vals = [(M.suffix_int(k, M.K_FRAC), row_mean(r, k)) for k in keys]
        if vals:
            bars.append((r, [(j, v) for j, v in vals if v is not None]))
    if not bars:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.8 / len(bars)
    for i, (r, vals) in enumerate(bars):
        ax.bar([j - 0.4 + w * (i + 0.5) for j, _ in vals], [v for _, v in vals], width=w, label=label(r))
    _finish(
        ax,
        "chosen k_t (0 = plain decode step)",
        "share of verification steps",
        "adaptive speculation: chosen k (mean after warm-up)",
    )
    return _save(fig, out / "k_histogram.png")


def plot_k_vs_batch(t: Target, out: Path) -> str | None:
    """Adaptive speculation: mean chosen k_t against the live batch size (power-of-two bins)."""
    lines = []
    for r in t.rows:
        keys = {k for x in row_runs(r) for k in x.history if k.startswith(M.K_MEAN_BY_ROWS)}
        pts = sorted((M.suffix_int(k, M.K_MEAN_BY_ROWS), row_mean(r, k)) for k in keys)
        pts = [(b, v) for b, v in pts if v is not None]
        if pts:
            lines.append((r, pts))
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, pts in lines:
        ax.plot([b for b, _ in pts], [v for _, v in pts], "o-", label=label(r))
    ax.set_xscale("log", base=2)
    _finish(
        ax,
        "live rows in the batch (bin upper bound)",
        "mean chosen k_t",
        "adaptive speculation: k against batch size",
        integer_x=False,
    )
    return _save(fig, out / "k_vs_batch.png")


def plot_completion_lengths(t: Target, out: Path) -> str | None:
    """Mean (solid) and longest (dotted) completion per RL step, per point: the long tail the gen stage waits for."""
    lines = [(r, x) for r in t.rows for x in row_runs(r, ok=False) if x.history.get(M.COMPLETIONS_MEAN_LENGTH)]
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    cmap = plt.get_cmap("tab10")
    for i, (r, x) in enumerate(lines):
        seed = f" seed={x.params[REPEAT_KEY]}" if len(r.outcomes) > 1 and REPEAT_KEY in x.params else ""
        color = cmap(i % 10)
        for key, ls, what in ((M.COMPLETIONS_MEAN_LENGTH, "-", "mean"), (M.COMPLETIONS_MAX_LENGTH, ":", "max")):
            pts = x.history.get(key) or []
            if pts:
                ax.plot(
                    [s for s, _ in pts],
                    [v for _, v in pts],
                    ls,
                    color=color,
                    marker="o" if what == "mean" else None,
                    ms=3,
                    label=f"{label(r)}{seed} ({what})",
                )
    _finish(ax, "RL step", "completion length (tokens)", "completion lengths per step: mean and longest")
    return _save(fig, out / "completion_lengths.png")


PLOTS = (
    (
        "speedup_vs_k",
        "Speedup vs k",
        plot_speedup_vs_k,
        "needs at least 2 speculative rows with a `drafter.k` param and a speedup (paired runs, or a "
        "`drafter.kind=none` baseline of the same setting)",
    ),
    (
        "acceptance_per_position",
        "Acceptance rate per draft position",
        plot_acceptance_per_position,
        "no `spec/acceptance_rate_pos_<i>` metrics (no speculative run)",
    ),
    (
        "acceptance_length_steps",
        "Acceptance length over RL steps",
        plot_acceptance_over_steps,
        "no `spec/acceptance_length` metrics (no speculative run)",
    ),
    (
        "stage_times",
        "Stage times: autoregressive vs best speculative point",
        plot_stage_times,
        "no `timing_s/*` metrics",
    ),
    ("reward_curves", "Reward with and without speculation", plot_rewards, "no `reward/mean` metrics in FINISHED runs"),
    ("completion_lengths", "Completion lengths", plot_completion_lengths, "no `completions/mean_length` metrics"),
    (
        "k_histogram",
        "Adaptive speculation: chosen k",
        plot_k_histogram,
        "no `spec/k_frac_<j>` metrics (no `drafter.adaptive` run)",
    ),
    (
        "k_vs_batch",
        "Adaptive speculation: k against batch size",
        plot_k_vs_batch,
        "no `spec/k_mean_rows_le_<b>` metrics (no `drafter.adaptive` run)",
    ),
)

NOTES = {
    "acceptance_length_steps": "Tokens emitted per verification step (bonus token included) at each RL step. "
    "A frozen drafter goes stale as the policy moves; online adaptation should hold it up. "
    "Solid: online (`drafter.online.enabled=true`) or unknown; dashed: frozen.",
    "acceptance_per_position": "Fraction of drafts whose position i was accepted; "
    "under the independence assumption it falls like α^(i+1).",
    "speedup_vs_k": "Error bars: 95 % CI of the paired speedup (none on `~` unpaired points). Dashed line: "
    "autoregressive (1×). Left: gen stage; right: whole step.",
    "k_histogram": "Share of a run's verification steps at each k_t the adaptive policy chose (`spec/k_frac_<j>`).",
    "k_vs_batch": "Mean k_t chosen by live batch size: a compute-bound full batch pays for every verified draft, "
    "the long tail of a few rows gets drafts almost for free.",
    "completion_lengths": "Speculation does not change the law of the completions, so their lengths should agree "
    "with and without it within sampling noise; the longest row per step is what a synchronous gen stage waits for. "
    "Each run also logs its per-row lengths, grouped by prompt (`completions/lengths/step_<n>.json`), which "
    "`wb simulate` takes as a workload (`workload.response.kind=run`, `--from-sweep`).",
    "reward_curves": "Speculative decoding is exact, so reward curves should agree within sampling noise "
    "(bands: mean ± sd over a drafter kind's runs; test in the training-signal section).",
}
