"""`wb report NAME`: a Markdown (and optional HTML) report with tables and PNG plots, read from MLflow.

    wb report my-sweep                 # reports/my-sweep/report.md + *.png
    wb report my-sweep --html          # + report.html
    wb report <run name or run id> --out /tmp/r

NAME is resolved, in order, as: a sweep (parent run tagged ``workbench.sweep``), an Optuna study
(parent run tagged ``workbench.study``), a run name (a run with child runs is reported as a
parent), or a run id. Any parent run works: its children are the runs tagged
``mlflow.parentRunId`` = its id.

Plots (matplotlib, Agg; each skipped with a note when there is no data for it): speedup vs k per
drafter kind; acceptance rate per draft position; acceptance length over RL steps (drafter
staleness; online vs frozen drafters told apart by the ``drafter.online.enabled`` param when
present); stage times of the autoregressive baseline vs the best speculative point; reward curves
with and without speculation (the training signal must be unchanged).

Numbers follow the sweep results table: means over steps 2.. (step 1 is warm-up) via
:func:`workbench.sweep.summarize`; speedups are the ``speedup/gen``/``speedup/step`` metrics the
sweep logged, else baseline s / point s against a ``drafter.kind=none`` run of the same parent.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAG_SWEEP = "workbench.sweep"
TAG_ROLE = "workbench.sweep.role"
TAG_STUDY = "workbench.study"
TAG_AXIS = "workbench.axis."
PARENT_RUN_TAG = "mlflow.parentRunId"

STAGES = ("data", "prepare", "gen", "reward", "logprob", "train", "draft_train", "other")
POS_PREFIX = "spec/acceptance_rate_pos_"
HISTORY_KEYS = ("timing_s/", "spec/acceptance_length", "spec/acceptance_rate", "reward/mean", "eval/accuracy", "speedup/")


class ReportError(ValueError):
    """NAME matches nothing, or the store cannot be read; the message lists what exists."""


# ----------------------------------------------------------------------------- data


@dataclass
class RunData:
    """One MLflow run with its per-step histories (``key -> [(step, value)]``, steps >= 1)."""

    run_id: str
    name: str
    status: str
    experiment_id: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]  # latest values
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    summary: dict[str, float | None] = field(default_factory=dict)
    speedup_gen: float | None = None
    speedup_step: float | None = None

    @property
    def kind(self) -> str:
        return self.params.get("drafter.kind", self.tags.get("workbench.drafter", "?"))

    @property
    def is_baseline(self) -> bool:
        return self.kind == "none"

    @property
    def k(self) -> int | None:
        try:
            return int(self.params["drafter.k"])
        except (KeyError, ValueError):
            return None

    @property
    def online(self) -> bool | None:
        v = self.params.get("drafter.online.enabled")
        return None if v is None else v.strip().lower() in ("true", "1", "yes")

    def steps(self) -> list[dict[str, float]]:
        """History as one dict per step (steps >= 1), the shape :func:`workbench.sweep.summarize` takes."""
        by: dict[int, dict[str, float]] = {}
        for key, pts in self.history.items():
            for s, v in pts:
                if s >= 1:
                    by.setdefault(s, {})[key] = v
        return [by[s] for s in sorted(by)]

    def mean(self, key: str) -> float | None:
        """Mean over steps 2.. (all steps if only one)."""
        pts = [v for s, v in self.history.get(key, []) if s >= 1]
        pts = pts[1:] if len(pts) > 1 else pts
        return sum(pts) / len(pts) if pts else None

    def label(self, axes: list[str]) -> str:
        if self.is_baseline:
            return "autoregressive"
        parts = [self.kind]
        for a in axes:
            if a == "drafter.kind":
                continue
            v = self.tags.get(TAG_AXIS + a) or self.params.get(a)
            if v not in (None, "-"):
                parts.append(f"{_short(a)}={v}")
        return " ".join(parts)


@dataclass
class Target:
    """What NAME resolved to: ``kind`` is sweep | study | parent | run."""

    kind: str
    name: str
    parent: RunData | None
    runs: list[RunData]  # children of the parent, or the single run
    tracking_uri: str
    experiment: str = ""
    axes: list[str] = field(default_factory=list)


def _short(key: str) -> str:
    return {"drafter.k": "k", "drafter.kind": "drafter", "drafter.init.data": "init"}.get(key, key)


def _client(tracking_uri: str | None):
    from mlflow import MlflowClient

    from workbench.tracking import _quiet_mlflow, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    _quiet_mlflow()
    return client, uri


def _experiment_ids(client) -> list[str]:
    from mlflow.entities import ViewType

    return [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000)]


def _search(client, exp_ids: list[str], filt: str, n: int = 1000) -> list[Any]:
    if not exp_ids:
        return []
    return client.search_runs(exp_ids, filt, order_by=["attributes.start_time DESC"], max_results=n)


def _q(v: str) -> str:
    return v.replace("'", "\\'")


def _load(client, run, full: bool = True) -> RunData:
    d = RunData(run.info.run_id, run.info.run_name or run.info.run_id, run.info.status, run.info.experiment_id,
                dict(run.data.params), dict(run.data.tags), dict(run.data.metrics))
    if full:
        for key in d.metrics:
            if key.startswith(HISTORY_KEYS) or key.startswith(POS_PREFIX):
                d.history[key] = sorted((m.step, m.value) for m in client.get_metric_history(d.run_id, key))
        from workbench.sweep import summarize

        d.summary = summarize(d.steps())
        d.speedup_gen = d.metrics.get("speedup/gen")
        d.speedup_step = d.metrics.get("speedup/step")
    return d


def recent_names(client, exp_ids: list[str], n: int = 8) -> tuple[list[str], list[str]]:
    """(recent sweep/study names, recent run names) for error messages."""
    parents = _search(client, exp_ids, f"tags.`{TAG_ROLE}` = 'parent'", n)
    studies = [r for r in _search(client, exp_ids, "", 200) if TAG_STUDY in r.data.tags and PARENT_RUN_TAG not in r.data.tags][:n]
    groups = list(dict.fromkeys([r.data.tags.get(TAG_SWEEP, "") for r in parents] + [r.data.tags[TAG_STUDY] for r in studies]))
    runs = list(dict.fromkeys(r.info.run_name for r in _search(client, exp_ids, "", n) if r.info.run_name))
    return [g for g in groups if g], runs


def resolve(name: str, tracking_uri: str | None = None) -> Target:
    """Resolve NAME (sweep, study, parent/run name, run id) and load every run's metrics.

    Raises:
        ReportError: nothing matches; the message lists recent sweeps/studies and runs.
    """
    client, uri = _client(tracking_uri)
    try:
        exp_ids = _experiment_ids(client)
    except Exception as e:  # noqa: BLE001 - unreachable server, unreadable store
        raise ReportError(f"cannot read the MLflow store {uri}: {e}") from None

    parent, kind = None, ""
    hits = _search(client, exp_ids, f"tags.`{TAG_SWEEP}` = '{_q(name)}' and tags.`{TAG_ROLE}` = 'parent'", 1)
    if hits:
        parent, kind = hits[0], "sweep"
    if parent is None:
        hits = [r for r in _search(client, exp_ids, f"tags.`{TAG_STUDY}` = '{_q(name)}'") if PARENT_RUN_TAG not in r.data.tags]
        if hits:
            parent, kind = hits[0], "study"
    single = None
    if parent is None:
        hits = _search(client, exp_ids, f"attributes.run_name = '{_q(name)}'", 1)
        if not hits and re.fullmatch(r"[0-9a-f]{8,64}", name):
            try:
                hits = [client.get_run(name)]
            except Exception:  # noqa: BLE001 - not a run id
                hits = []
        if hits:
            single = hits[0]
    if parent is None and single is not None:
        kids = _search(client, [single.info.experiment_id], f"tags.`{PARENT_RUN_TAG}` = '{single.info.run_id}'", 1)
        if kids:
            parent, kind = single, "parent"
    if parent is None and single is None:
        groups, runs = recent_names(client, exp_ids)
        raise ReportError(
            f"no sweep, study, run name or run id {name!r} in {uri}\n"
            f"  recent sweeps/studies: {', '.join(groups) or '(none)'}\n"
            f"  recent runs: {', '.join(runs) or '(none)'}\n"
            "  (set the store with --tracking-uri or $MLFLOW_TRACKING_URI)"
        )
    exp = client.get_experiment((parent or single).info.experiment_id)
    if parent is not None:
        kids = client.search_runs([parent.info.experiment_id], f"tags.`{PARENT_RUN_TAG}` = '{parent.info.run_id}'",
                                  order_by=["attributes.start_time ASC"], max_results=10_000)
        runs = _latest_per_point([_load(client, r) for r in kids])
        target = Target(kind, name, _load(client, parent, full=False), runs, uri, exp.name)
    else:
        target = Target("run", name, None, [_load(client, single)], uri, exp.name)
    target.axes = _axes(target)
    _fill_speedups(target.runs)
    return target


def _latest_per_point(runs: list[RunData]) -> list[RunData]:
    """A resumed sweep has FAILED and FINISHED children of one point: keep the FINISHED (else last) one."""
    by: dict[str, RunData] = {}
    for r in runs:  # oldest first
        key = r.tags.get("workbench.sweep.point", r.run_id)
        old = by.get(key)
        if old is None or r.status == "FINISHED" or old.status != "FINISHED":
            by[key] = r
    return list(by.values())


def _axes(t: Target) -> list[str]:
    """Axis keys: the parent's / children's ``workbench.axis.*`` tags, else params that differ between runs."""
    keys: list[str] = []
    for r in ([t.parent] if t.parent else []) + t.runs:
        keys += [k[len(TAG_AXIS):] for k in r.tags if k.startswith(TAG_AXIS)]
    keys = list(dict.fromkeys(keys))
    if keys or len(t.runs) < 2:
        return keys
    skip = ("tracking.", "name")
    allk = sorted({k for r in t.runs for k in r.params if not k.startswith(skip)})
    return [k for k in allk if len({r.params.get(k) for r in t.runs}) > 1][:6]


def _same_setting(a: RunData, b: RunData) -> bool:
    keys = {k for k in (*a.params, *b.params) if not k.startswith(("drafter.", "tracking."))}
    return all(a.params.get(k) == b.params.get(k) for k in keys)


def baseline_for(r: RunData, runs: list[RunData]) -> RunData | None:
    """The ``drafter.kind=none`` run with the same non-drafter params (else any baseline)."""
    bases = [b for b in runs if b.is_baseline and b.status != "FAILED"]
    same = [b for b in bases if _same_setting(r, b)]
    return (same or bases or [None])[0]


def _fill_speedups(runs: list[RunData]) -> None:
    from workbench.sweep import speedup

    for r in runs:
        b = baseline_for(r, runs)
        if b is None:
            continue
        if r.speedup_gen is None:
            r.speedup_gen = speedup(b.summary.get("timing_s/gen"), r.summary.get("timing_s/gen"))
        if r.speedup_step is None:
            r.speedup_step = speedup(b.summary.get("timing_s/step"), r.summary.get("timing_s/step"))


def best_run(runs: list[RunData]) -> RunData | None:
    cands = [r for r in runs if not r.is_baseline and r.speedup_gen is not None and r.status != "FAILED"]
    return max(cands, key=lambda r: r.speedup_gen) if cands else None


# ----------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path.name


def plot_speedup_vs_k(t: Target, out: Path) -> str | None:
    pts = [r for r in t.runs if not r.is_baseline and r.k is not None and r.speedup_gen is not None]
    if len(pts) < 2:  # one point (e.g. a single run) is no curve
        return None
    plt = _plt()
    fig, axs = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    other = [a for a in t.axes if a not in ("drafter.kind", "drafter.k")]
    groups: dict[str, list[RunData]] = {}
    for r in pts:
        key = r.kind + "".join(f" {_short(a)}={r.tags.get(TAG_AXIS + a) or r.params.get(a)}" for a in other)
        groups.setdefault(key, []).append(r)
    for ax, attr, title in ((axs[0], "speedup_gen", "generation (gen stage)"), (axs[1], "speedup_step", "whole RL step")):
        for label, rs in sorted(groups.items()):
            rs = sorted((r for r in rs if getattr(r, attr) is not None), key=lambda r: r.k)
            if rs:
                ax.plot([r.k for r in rs], [getattr(r, attr) for r in rs], "o-", label=label)
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="autoregressive (1×)")
        ax.set_xlabel("k (draft tokens per verification step)")
        ax.set_ylabel("speedup (baseline s / point s)")
        ax.set_title(f"speedup vs k: {title}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, out / "speedup_vs_k.png")


def plot_acceptance_per_position(t: Target, out: Path) -> str | None:
    rows = []
    for r in t.runs:
        pos = sorted((int(k[len(POS_PREFIX):]), r.mean(k)) for k in r.history if k.startswith(POS_PREFIX))
        pos = [(i, v) for i, v in pos if v is not None]
        if pos:
            rows.append((r, pos))
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, pos in rows:
        ax.plot([i for i, _ in pos], [v for _, v in pos], "o-", label=r.label(t.axes))
    ax.set_xlabel("draft position i (0 = first draft token)")
    ax.set_ylabel("acceptance rate at position i")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("per-position acceptance (mean over steps 2..)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "acceptance_per_position.png")


def plot_acceptance_over_steps(t: Target, out: Path) -> str | None:
    rows = [(r, r.history["spec/acceptance_length"]) for r in t.runs if r.history.get("spec/acceptance_length")]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, pts in rows:
        style = {True: "-", False: "--", None: "-"}[r.online]
        tag = {True: " (online)", False: " (frozen)", None: ""}[r.online]
        ax.plot([s for s, _ in pts], [v for _, v in pts], style, marker="o", ms=3, label=r.label(t.axes) + tag)
    ax.set_xlabel("RL step")
    ax.set_ylabel("acceptance length (tokens / verification)")
    ax.set_title("acceptance length over training (drafter staleness)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "acceptance_length_steps.png")


def stage_rows(t: Target) -> tuple[list[RunData], list[tuple[str, list[float | None]]]]:
    """Runs shown in the stage table (baseline, best point; else every run up to 4) and its rows."""
    best = best_run(t.runs)
    if best is not None and baseline_for(best, t.runs) is not None:
        shown = [baseline_for(best, t.runs), best]
    else:
        shown = [r for r in t.runs if any(k.startswith("timing_s/") for k in r.history)][:4]
    rows = [(s, [r.mean(f"timing_s/{s}") for r in shown]) for s in STAGES]
    rows = [(s, v) for s, v in rows if any(x for x in v)]
    rows.append(("total", [r.mean("timing_s/step") for r in shown]))
    return shown, rows


def plot_stage_times(t: Target, out: Path) -> str | None:
    shown, rows = stage_rows(t)
    if not shown or all(v is None for v in rows[-1][1]):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.9 * len(shown)))
    labels = [r.label(t.axes) for r in shown]
    left = [0.0] * len(shown)
    cmap = plt.get_cmap("tab10")
    for i, (stage, vals) in enumerate(rows[:-1]):
        v = [x or 0.0 for x in vals]
        ax.barh(labels, v, left=left, color=cmap(i % 10), label=stage)
        left = [a + b for a, b in zip(left, v)]
    for y, (tot, r) in enumerate(zip(rows[-1][1], shown)):
        if tot is not None:
            txt = f" {tot:.3f} s" + (f"  ({r.speedup_step:.2f}× step)" if r.speedup_step and not r.is_baseline else "")
            ax.text(max(tot, left[y]), y, txt, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per RL step (mean over steps 2..)")
    ax.set_title("where a step's time goes")
    ax.set_xlim(0, max(left + [x or 0 for x in rows[-1][1]]) * 1.35 or 1)
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    return _save(fig, out / "stage_times.png")


def plot_rewards(t: Target, out: Path) -> str | None:
    rows = [(r, r.history["reward/mean"]) for r in t.runs if r.history.get("reward/mean")]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, pts in rows:
        kw = dict(color="black", lw=2.2, ls="-") if r.is_baseline else dict(lw=1.2, ls="--")
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", ms=3, label=r.label(t.axes), **kw)
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward/mean")
    ax.set_title("reward with and without speculation (should overlap: training unchanged)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "reward_curves.png")


# ----------------------------------------------------------------------------- markdown


def _fmt(v: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _md_table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right or set()
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table_md(t: Target) -> str:
    """The sweep results table's columns: drafter, axes, acc.len, acc.rate, gen s, step s, gen×, step×, reward, status."""
    best = best_run(t.runs)
    axes = [a for a in t.axes if a != "drafter.kind"]
    header = ["drafter", *[_short(a) for a in axes], "acc.len", "acc.rate", "gen s", "step s", "gen×", "step×", "reward", "status", "run"]
    rows = []
    for r in t.runs:
        s = r.summary
        vals = [(r.tags.get(TAG_AXIS + a) or ("-" if r.is_baseline and a.startswith("drafter.") else r.params.get(a, "-"))) for a in axes]
        star = " ★" if r is best else ""
        rows.append([
            r.kind, *vals, _fmt(s.get("spec/acceptance_length"), ".2f"), _fmt(s.get("spec/acceptance_rate"), ".2f"),
            _fmt(s.get("timing_s/gen")), _fmt(s.get("timing_s/step")), _fmt(r.speedup_gen, ".2f", "×") + star,
            _fmt(r.speedup_step, ".2f", "×"), _fmt(s.get("reward/final")), r.status.lower(), f"`{r.run_id[:8]}`",
        ])
    n = len(axes)
    return _md_table(header, rows, right=set(range(1 + n, 1 + n + 7)))


def stage_table_md(t: Target) -> str:
    shown, rows = stage_rows(t)
    header = ["stage", *[r.label(t.axes) + " (s)" for r in shown]]
    pair = len(shown) == 2 and shown[0].is_baseline and not shown[1].is_baseline
    if pair:
        header.append("speedup")
    out = []
    for stage, vals in rows:
        row = [f"**{stage}**" if stage == "total" else stage, *[_fmt(v) for v in vals]]
        if pair:
            a, b = vals
            row.append(_fmt(a / b, ".2f", "×") if a and b else "-")
        out.append(row)
    return _md_table(header, out, right=set(range(1, len(header))))


PLOTS = (
    ("speedup_vs_k", "Speedup vs k", plot_speedup_vs_k,
     "needs at least 2 speculative runs with a `drafter.k` param and a speedup (a sweep with a `drafter.kind=none` baseline)"),
    ("acceptance_per_position", "Acceptance rate per draft position", plot_acceptance_per_position,
     "no `spec/acceptance_rate_pos_<i>` metrics (no speculative run)"),
    ("acceptance_length_steps", "Acceptance length over RL steps", plot_acceptance_over_steps,
     "no `spec/acceptance_length` metrics (no speculative run)"),
    ("stage_times", "Stage times: autoregressive vs best speculative point", plot_stage_times,
     "no `timing_s/*` metrics"),
    ("reward_curves", "Reward with and without speculation", plot_rewards, "no `reward/mean` metrics"),
)

NOTES = {
    "acceptance_length_steps": "Tokens emitted per verification step (bonus token included) at each RL step. "
    "A frozen drafter goes stale as the policy moves; online adaptation should hold it up. "
    "Solid: online (`drafter.online.enabled=true`) or unknown; dashed: frozen.",
    "acceptance_per_position": "Fraction of drafts whose position i was accepted; "
    "under the independence assumption it falls like α^(i+1).",
    "speedup_vs_k": "Dashed line: autoregressive generation (1×). Left: gen stage; right: whole step.",
    "reward_curves": "Speculative decoding is exact, so reward curves should agree within sampling noise.",
}


@dataclass
class Report:
    out: Path
    markdown: Path
    html: Path | None
    plots: list[str]
    skipped: list[str]


def write_report(t: Target, out: Path, with_html: bool = False) -> Report:
    """Write ``report.md`` (+ ``report.html``) and the PNGs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    best = best_run(t.runs)
    md = [f"# Report: {t.kind} `{t.name}`", ""]
    meta = [f"- store: `{t.tracking_uri}`, experiment `{t.experiment}`"]
    if t.parent:
        meta.append(f"- parent run `{t.parent.run_id}` ({t.parent.status.lower()}), {len(t.runs)} child runs")
        fixed = t.parent.tags.get("workbench.sweep.fixed")
        if fixed:
            meta.append(f"- fixed overrides: `{fixed}`")
        if t.parent.tags.get("workbench.spec"):
            meta.append(f"- spec: `{t.parent.tags['workbench.spec']}`")
    else:
        r = t.runs[0]
        meta.append(f"- run `{r.name}` (`{r.run_id}`, {r.status.lower()}), drafter `{r.kind}`" + (f", k={r.k}" if r.k and not r.is_baseline else ""))
    if t.axes:
        meta.append("- axes: " + ", ".join(f"`{a}`" for a in t.axes))
    if best is not None:
        meta.append(f"- **best speedup: {best.label(t.axes)}: {_fmt(best.speedup_gen, '.2f', '×')} generation, "
                    f"{_fmt(best.speedup_step, '.2f', '×')} step**")
    meta.append(f"- generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `wb report`")
    md += meta + ["", "## Results", "", results_table_md(t), "",
                  "acc.len / acc.rate / gen s / step s: means over steps 2.. (step 1 = warm-up); "
                  "gen× / step× speedup: baseline s / point s (> 1: faster than autoregressive); reward: last step's "
                  "`reward/mean`; ★ best gen×.", ""]
    md += ["## Stage times", "", stage_table_md(t), "",
           "Seconds per RL step, means over steps 2..; speedup = autoregressive s / speculative s.", ""]
    plots, skipped = [], []
    for key, title, fn, why in PLOTS:
        md += [f"## {title}", ""]
        try:
            name = fn(t, out)
        except Exception as e:  # noqa: BLE001 - one broken plot must not lose the report
            name, why = None, f"plot failed: {type(e).__name__}: {e}"
        if name:
            plots.append(name)
            md += [f"![{title}]({name})", ""]
            if key in NOTES:
                md += [NOTES[key], ""]
        else:
            skipped.append(key)
            md += [f"_Skipped: {why}._", ""]
    text = "\n".join(md)
    path = out / "report.md"
    path.write_text(text)
    html_path = None
    if with_html:
        html_path = out / "report.html"
        html_path.write_text(markdown_to_html(text, title=f"wb report {t.name}"))
    return Report(out, path, html_path, plots, skipped)


# ----------------------------------------------------------------------------- html


def _inline(s: str) -> str:
    s = html.escape(s, quote=False)
    s = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r'<img alt="\1" src="\2">', s)
    s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', s)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"(?<![\w*])_([^_]+)_(?![\w*])", r"<em>\1</em>", s)
    return s


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def markdown_to_html(text: str, title: str = "report") -> str:
    """The Markdown subset ``write_report`` emits: headings, lists, tables, images, paragraphs."""
    try:
        import markdown  # type: ignore

        body = markdown.markdown(text, extensions=["tables"])
    except ImportError:
        out, lines, i = [], text.splitlines(), 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("#"):
                n = len(line) - len(line.lstrip("#"))
                out.append(f"<h{n}>{_inline(line[n:].strip())}</h{n}>")
            elif line.startswith("- "):
                items = []
                while i < len(lines) and lines[i].startswith("- "):
                    items.append(f"<li>{_inline(lines[i][2:])}</li>")
                    i += 1
                out.append("<ul>" + "".join(items) + "</ul>")
                continue
            elif line.startswith("|"):
                block = []
                while i < len(lines) and lines[i].startswith("|"):
                    block.append(lines[i])
                    i += 1
                aligns = ["right" if c.endswith(":") else "left" for c in _cells(block[1])] if len(block) > 1 else []
                head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(block[0]))
                body_rows = "".join(
                    "<tr>" + "".join(f'<td style="text-align:{aligns[j] if j < len(aligns) else "left"}">{_inline(c)}</td>'
                                     for j, c in enumerate(_cells(r))) + "</tr>"
                    for r in block[2:]
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body_rows}</tbody></table>")
                continue
            elif line.strip():
                out.append(f"<p>{_inline(line)}</p>")
            i += 1
        body = "\n".join(out)
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 3px}")
    return f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title><style>{style}</style></head>\n<body>\n{body}\n</body></html>\n"


def safe_dirname(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "report"


def make_report(name: str, out: str | Path | None = None, with_html: bool = False, tracking_uri: str | None = None) -> tuple[Target, Report]:
    """Resolve NAME and write the report into ``out`` (default ``reports/<NAME>``)."""
    t = resolve(name, tracking_uri)
    return t, write_report(t, Path(out) if out else Path("reports") / safe_dirname(name), with_html)
