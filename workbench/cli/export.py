"""`wb export`: a sweep's or study's best point as vLLM / NeMo RL / verl / TRL settings (docs/export.md)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli.common import _fail, app, console


@app.command("export", context_settings={"allow_extra_args": False})
def export(
    name: str = typer.Argument(..., help="A sweep name, an Optuna study name, a run name or a run id."),
    point: Optional[str] = typer.Option(
        None,
        "--point",
        "-p",
        help="The point to export instead of the best: its label as `wb report` prints it ('ngram k=2') or "
        "KEY=VALUE[,KEY=VALUE...] (aliases k, drafter, init, online), e.g. --point drafter=ngram,k=3.",
    ),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default: exports/NAME)."),
    fmt: str = typer.Option("all", "--format", "-f", help="vllm | nemo-rl | verl | trl | all (comma-separated)."),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."
    ),
) -> None:
    """Write the best point's (or --point's) speculative decoding settings for the framework you train with:
    speculative_config.json (vLLM), nemo_rl.yaml, verl.yaml, trl_vllm_serve.sh, point.json, and the
    drafter in vLLM's layout where the kind has one.

    Examples: wb export my-sweep | wb export my-sweep --point drafter=ngram,k=3 --format vllm,trl
    """
    from workbench.report.export import CHECKED, FORMATS, ExportError
    from workbench.report.export_point import export_point

    formats = FORMATS if fmt.strip() == "all" else tuple(f.strip() for f in fmt.split(",") if f.strip())
    try:
        ex = export_point(name, point, out, formats, tracking_uri, progress=False)
    except ExportError as e:
        _fail(" ".join(str(e).split()))  # one line: the store's listing joined
    from workbench.report.tables import fmt_ci

    why = (
        "chosen by --point"
        if point is not None
        else ("best: its 95 % CI clears every other point's" if ex.decided else "top mean (not separated)")
    )
    table = Table(title=f"wb export {escape(name)} ({ex.kind})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("point", f"{escape(ex.label)} ({why})")
    table.add_row("gen speedup", escape(fmt_ci(ex.row.gen, ex.row.paired)))
    table.add_row("speculative_config", escape(_json(ex.speculative_config)))
    if ex.head:
        table.add_row("drafter folder", escape(f"{ex.head} ({ex.head_source})"))
    table.add_row("checked against", escape(CHECKED["vllm"]))
    for n in ex.notes:
        table.add_row("note", escape(n))
    table.add_row("files", escape(", ".join(str(f) for f in ex.files)))
    console.print(table)


def _json(obj) -> str:
    import json

    return json.dumps(obj)
