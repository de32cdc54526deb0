"""The `wb` command (Typer + Rich): one thin module per command (parse -> call a library function -> render).

``workbench.cli.common`` holds the Typer app and what the commands share; importing this package
registers every command on it.
"""

from workbench.cli import (  # noqa: F401 (registers the commands)
    audit,
    bench,
    drafter,
    export,
    models,
    project,
    report,
    run,
    simulate,
    specs,
    sweep,
    tune,
    ui,
)
from workbench.cli.common import _load, app, console, err

__all__ = ["app", "console", "err", "main", "_load"]


def main() -> None:  # pragma: no cover
    """``python -m workbench.cli``: as ``wb`` (:func:`workbench.wb.main`), the preload decided after the imports."""
    from workbench.vllm.runtime import reexec_if_needed

    reexec_if_needed()
    app()
