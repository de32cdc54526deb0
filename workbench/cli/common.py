"""What every `wb` command shares: the Typer apps, the consoles, spec loading and clear errors (exit 2)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from workbench.console import make_console
from workbench.specs import SpecError, load_spec

app = typer.Typer(
    help="The speculation workbench: how much does exact speculative decoding speed up GRPO rollouts?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Embedded model presets: list and build (cached).", no_args_is_help=True)


def _version(value: bool) -> None:
    if value:
        from workbench.version import version_line

        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version (and git commit) and exit."
    ),
) -> None:
    """The speculation workbench: how much does exact speculative decoding speed up GRPO rollouts?"""


app.add_typer(models_app, name="models")
drafter_app = typer.Typer(
    help="Drafter initialisation: train a drafter on the target's completions (cached).", no_args_is_help=True
)
app.add_typer(drafter_app, name="drafter")
# full width when piped (a CI log keeps every column and CI): workbench.console
console = make_console()
err = make_console(stderr=True)


def _fail(msg: str) -> None:
    """Print ``error: MSG`` on stderr and exit 2. MSG is text, never markup: it is escaped here, so a
    message quoting ``[/]``, ``[vllm-cpu]`` or a YAML list prints as written."""
    err.print(f"[bold red]error:[/] {escape(str(msg))}", highlight=False)
    raise typer.Exit(2)


def _split_args(spec: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """`wb run drafter.k=5`: a first argument with '=' is an override, not a spec name."""
    items = list(overrides or [])
    if spec is not None and "=" in spec:
        return None, [spec, *items]
    return spec, items


def _load(spec: str | None, overrides: list[str] | None):
    """The resolved spec, or a clear error (exit 2) naming the bad field."""
    try:
        return load_spec(*_split_args(spec, overrides))
    except SpecError as e:
        _fail(str(e))


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        if ".." in text:
            lo, hi = text.split("..")
            vals = tuple(range(int(lo), int(hi) + 1))
        else:
            vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        _fail(f"{what}: {text!r} is not a list of integers; use e.g. 1,8,64 or 1..7")
    if not vals or min(vals) < 1:
        _fail(f"{what}: {text!r} must name integers >= 1")
    return vals


def _named_floats(values: Optional[list[str]], what: str) -> dict[str, float]:
    """["0.7", "ngram=0.6"] -> {"": 0.7, "ngram": 0.6}."""
    out: dict[str, float] = {}
    for v in values or []:
        name, _, num = v.rpartition("=")
        try:
            out[name] = float(num)
        except ValueError:
            _fail(f"{what}: {v!r} is not a number or NAME=number")
    return out
