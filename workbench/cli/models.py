"""`wb models`: list and build the embedded model presets."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from workbench.cli.common import _fail, console, models_app
from workbench.specs import load_spec


@models_app.command("list")
def models_list() -> None:
    """List model presets and whether each is built in the cache."""
    from workbench.models.build import (
        build_info,
        cache_dir,
        is_built,
        list_presets,
        preset_dir,
    )

    table = Table(title=f"model presets (cache: {cache_dir()})")
    for col in ("name", "role", "built", "params", "notes"):
        table.add_column(col)
    for p in list_presets():
        info = build_info(preset_dir(p.name)) if is_built(p.name) else None
        params = f"{info['num_params'] / 1e6:.2f}M" if info and "num_params" in info else ""
        table.add_row(p.name, p.role, "yes" if info else "no", params, p.description)
    console.print(table)


@models_app.command("build")
def models_build(
    names: Optional[list[str]] = typer.Argument(None, help="Preset names (default: the quickstart's target and draft)."),
) -> None:
    """Build presets into the cache (pretrain targets on the task format, distil drafts)."""
    from workbench.models.build import build_info, resolve_model

    if not names:
        s = load_spec(None)
        names = [s.model.target, s.drafter.model]
    for name in names:
        try:
            path = resolve_model(name, progress=True, what="preset")
        except ValueError as e:
            _fail(str(e))
        info = build_info(path) or {}
        shown = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
        console.print(f"[green]{name}[/] -> {path}  {shown}")
