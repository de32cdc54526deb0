"""The one progress-bar layout of long steps (model builds, drafter init, cost-curve measurements).

    with progress_bar(enabled) as bar:
        task = bar.add_task("build tiny", total=steps, info="")
        bar.update(task, completed=step, info=f"loss {loss:.3f}")

A plain Rich ``Progress``; ``enabled=False`` gives a disabled one (every call a no-op, nothing
drawn), so callers never branch on whether a bar is shown.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(enabled: bool = True, console: Console | None = None) -> Progress:
    """A Rich Progress with columns: description, bar, done/total, elapsed, and the task's ``info`` field.

    Tasks must be added with an ``info=""`` field (the last column reads it).
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=not enabled,
    )
