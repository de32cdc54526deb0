"""Writing a report: ``report.md`` with its tables and plots, and ``report.html`` (markdown-it-py)."""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.report.learning import eval_rise_md
from workbench.report.plots import NOTES, PLOTS
from workbench.report.tables import RESULTS_NOTE, fmt_ci, results_table_md, stage_table_md, training_signal_md, verdict
from workbench.report.target import Target, label, resolve
from workbench.tags import TAG_ENGINE_PATH, TAG_MACHINE


@dataclass
class Report:
    out: Path
    markdown: Path
    html: Path | None
    plots: list[str]
    skipped: list[str]


def header_md(t: Target) -> list[str]:
    """Title and the bullet list: store, parent, axes, best point or tie, date."""
    md = [f"# Report: {t.kind} `{t.name}`", ""]
    meta = [f"- store: `{t.tracking_uri}`, experiment `{t.experiment}`"]
    if t.parent:
        meta.append(f"- parent run `{t.parent.run_id}` ({t.parent.status.lower()}), {len(t.runs)} child runs")
        for tag, what in (("workbench.sweep.fixed", "fixed overrides"), ("workbench.spec", "spec")):
            if t.parent.tags.get(tag):
                meta.append(f"- {what}: `{t.parent.tags[tag]}`")
    elif t.kind == "experiment":
        states = sorted({r.status.lower() for r in t.runs}, key=lambda s: (s != "finished", s))
        meta.append(
            f"- {len(t.runs)} top-level runs "
            f"({', '.join(f'{sum(r.status.lower() == s for r in t.runs)} {s}' for s in states)}): "
            + ", ".join(f"`{r.name}`" for r in t.runs)
        )
    else:
        r = t.runs[0]
        meta.append(
            f"- run `{r.name}` (`{r.run_id}`, {r.status.lower()}), drafter `{r.kind}`" + (f", k={r.k}" if r.k else "")
        )
    if t.axes:
        meta.append("- axes: " + ", ".join(f"`{a}`" for a in t.axes))
    dec = t.decision
    if dec.best:
        best = next(r for r in t.rows if label(r) == dec.best)
        meta.append(
            f"- **best speedup: {dec.best}: {fmt_ci(best.gen, best.paired)} generation, "
            f"{fmt_ci(best.step, best.paired)} step** (its 95 % CI clears every other point's)"
        )
    elif dec.tied:
        meta.append(f"- {verdict(t)}")
    hosts = sorted({r.tags[TAG_MACHINE] for r in t.runs if r.tags.get(TAG_MACHINE)})
    if hosts:  # where speculation pays depends on the host's instruction sets (AVX-512, AMX)
        meta.append("- machine: " + "; ".join(hosts))
    paths = sorted({r.tags[TAG_ENGINE_PATH] for r in t.runs if r.tags.get(TAG_ENGINE_PATH)})
    if paths:  # packed weights (rollout.prepack_weights) or not changes where speculation pays on a CPU
        meta.append("- workbench engine: " + "; ".join(paths))
    meta.append(f"- generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `wb report`")
    return md + meta + [""]


def write_report(t: Target, out: Path, with_html: bool = False) -> Report:
    """Write ``report.md`` (+ ``report.html``) and the PNGs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    md = header_md(t)
    md += ["## Results", "", results_table_md(t), "", RESULTS_NOTE, ""]
    md += [
        "## Stage times",
        "",
        stage_table_md(t),
        "",
        "Seconds per RL step, means after warm-up (`measure.warmup_steps`); speedup: paired where the run was "
        "paired (gen, total), else `~` autoregressive s / speculative s (timings taken at different times).",
        "",
    ]
    md += ["## Training signal with and without speculation", "", *training_signal_md(t), ""]
    rise = eval_rise_md(t)
    if rise:
        md += ["## Does GRPO learn? Held-out accuracy before and after", "", *rise]
    plots, skipped = [], []
    for key, title, fn, why in PLOTS:
        md += [f"## {title}", ""]
        try:
            name = fn(t, out)
        except Exception as e:  # noqa: BLE001 - one broken plot must not lose the report
            name, why = None, f"plot failed: {type(e).__name__}: {e}"
        if name:
            plots.append(name)
            md += [f"![{title}]({name})", ""] + ([NOTES[key], ""] if key in NOTES else [])
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


def report(
    name: str, out: str | Path | None = None, html: bool = False, tracking_uri: str | None = None
) -> tuple[Target, Report]:
    """``wb report`` from Python: :func:`make_report` (``html``: also ``report.html``).

    Raises:
        ReportError: NAME names no sweep, study or run in the store.
    """
    return make_report(name, out, with_html=html, tracking_uri=tracking_uri)


REPORT_ARTIFACTS = "report"  # the artifact folder of the reported run that holds the report's files

STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:3px 8px}"
    "th{background:#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 3px}"
)


def markdown_to_html(text: str, title: str = "report") -> str:
    """A standalone HTML page of ``text`` (CommonMark + GitHub tables, rendered by markdown-it-py) with raw
    HTML off: a tag value from the store such as ``<img onerror=...>`` is shown as text, never run."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style>'
        f"</head>\n<body>\n{body}\n</body></html>\n"
    )


def safe_dirname(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "report"


def make_report(
    name: str, out: str | Path | None = None, with_html: bool = False, tracking_uri: str | None = None
) -> tuple[Target, Report]:
    """Resolve NAME and write the report into ``out`` (default ``reports/<NAME>``), then log its files to the
    run it reports on (the sweep's or study's parent run, or the run itself) under ``report/``, as MLflow
    keeps what describes a run with the run.

    Raises:
        ReportError: NAME names no sweep, study or run in the store.
    """
    t = resolve(name, tracking_uri)
    rep = write_report(t, Path(out) if out else Path("reports") / safe_dirname(name), with_html)
    owner = t.parent or (t.runs[0] if len(t.runs) == 1 else None)
    if owner is not None:
        from mlflow import MlflowClient

        MlflowClient(t.tracking_uri).log_artifacts(owner.run_id, str(rep.out), artifact_path=REPORT_ARTIFACTS)
    return t, rep
