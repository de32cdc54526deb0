"""`wb specs`: the shipped specs (list, copy one out to edit) and the spec's JSON Schema for editors."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli.common import _fail, app, console
from workbench.specs import SpecError

specs_app = typer.Typer(help="Shipped experiment specs: list, copy one to edit, the JSON Schema.", no_args_is_help=True)
app.add_typer(specs_app, name="specs")


@specs_app.command("list")
def specs_list() -> None:
    """List the specs shipped with the package, each with its purpose (a name works wherever a spec is taken)."""
    from workbench.specs.catalog import shipped_specs

    table = Table(title="shipped specs (wb run NAME, wb specs copy NAME)")
    table.add_column("name", no_wrap=True)
    table.add_column("purpose")
    for s in shipped_specs():
        table.add_row(escape(s.name), escape(s.purpose))
    console.print(table)


@specs_app.command("copy")
def specs_copy(
    name: str = typer.Argument(..., help="A shipped spec's name (wb specs list) or a spec file."),
    dest: Optional[Path] = typer.Argument(None, help="File or folder to write (default ./NAME.yaml)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a shipped spec out for editing; then `wb run DEST.yaml key=value ...`."""
    from workbench.specs.catalog import copy_spec

    try:
        out = copy_spec(name, dest, force=force)
    except SpecError as e:
        _fail(str(e))
    console.print(f"wrote {escape(str(out))}: edit it, then [bold]wb run {escape(str(out))}[/]", highlight=False)


@specs_app.command("schema")
def specs_schema(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file or folder (default: stdout)."),
) -> None:
    """The JSON Schema of an experiment spec (editors: `# yaml-language-server: $schema=FILE` as a first line)."""
    from workbench.specs.catalog import schema_text, write_schema

    if out is None:
        typer.echo(schema_text(), nl=False)
        return
    try:
        path = write_schema(out)
    except SpecError as e:
        _fail(str(e))
    console.print(f"wrote {escape(str(path))}", highlight=False)
