"""`wb run`: one experiment (GRPO with speculative rollouts), one MLflow run."""

from __future__ import annotations

from typing import Optional

import typer
from rich.syntax import Syntax

from workbench.cli.common import _fail, _load, app, console, err


@app.command(context_settings={"allow_extra_args": False})
def run(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted when giving overrides."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. drafter.kind=ngram drafter.k=5"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved spec and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or tables."),
) -> None:
    """Run one experiment: GRPO training whose rollouts come from the speculative rollout engine."""
    resolved = _load(spec, overrides)
    if dry_run:
        console.print(Syntax(resolved.to_yaml(), "yaml", theme="ansi_dark", background_color="default"))
        return
    from workbench.experiment import run_experiment

    try:
        run_experiment(resolved, console=console, progress=not quiet)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted: MLflow run marked KILLED[/]")
        raise typer.Exit(130)
    except ValueError as e:  # bad input found while preparing (checkpoint, data file, tokenizer)
        _fail(str(e))
