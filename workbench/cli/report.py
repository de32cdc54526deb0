"""`wb report`: Markdown/HTML report of a sweep, study or run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from workbench.cli.common import _fail, app, console


@app.command(context_settings={"allow_extra_args": False})
def report(
    name: str = typer.Argument(..., help="A sweep name, an Optuna study name, a run name or a run id."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default: reports/NAME)."),
    html: bool = typer.Option(False, "--html", help="Also write report.html."),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."
    ),
) -> None:
    """Write report.md (+ PNG plots, --html) for a sweep, study or run, read from MLflow.

    Examples: wb report my-sweep | wb report my-sweep --html --out /tmp/r | wb report <run id>
    """
    from workbench.report import ReportError, make_report
    from workbench.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    if db and db != ":memory:" and not Path(db).is_file():  # (reading would create an empty store there)
        _fail(f"no MLflow store at {db} (from {uri}): give --tracking-uri or run wb report where mlflow.db is")
    try:
        target, rep = make_report(name, out, with_html=html, tracking_uri=tracking_uri)
    except ReportError as e:
        _fail(str(e))
    except OSError as e:  # an output folder that cannot be written: read-only, a file in the way
        where = e.filename or out or f"reports/{name}"
        _fail(f"cannot write the report to {where}: {e.strerror or e}; give a writable folder with --out")
    console.print(
        f"{target.kind} [bold]{escape(name)}[/]: {len(target.runs)} run(s) -> [bold]{escape(str(rep.markdown))}[/]"
        + (f", {escape(str(rep.html))}" if rep.html else "")
    )
    console.print(
        escape(
            f"plots: {', '.join(rep.plots) or '(none)'}"
            + (f"; skipped (no data): {', '.join(rep.skipped)}" if rep.skipped else "")
        ),
        highlight=False,
    )
