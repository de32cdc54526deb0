"""`wb drafter init`: train and cache a drafter initialisation."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from workbench.cli.common import _fail, _load, console, drafter_app


@drafter_app.command("init", context_settings={"allow_extra_args": False})
def drafter_init(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or name (default: quickstart). May be omitted when giving overrides."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. drafter.kind=eagle3 drafter.init.data=chat"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Train the spec's drafter on its init data (in_domain | chat | a dataset) and cache the checkpoint."""
    resolved = _load(spec, overrides)
    d = resolved.drafter
    if d.init_data() == "none" or d.kind in ("none", "ngram"):
        _fail(f"drafter.init.data: nothing to initialise for drafter.kind={d.kind} with init.data={d.init_data()}; "
              "use drafter.kind=draft_model|mtp|eagle3 and drafter.init.data=in_domain|chat|<file>")
    from workbench.drafter_init import build_init, init_info
    from workbench.grpo.trainer import resolve_device
    from workbench.models.build import load_model, resolve_model
    from workbench.rollout.model import LeanLM

    try:
        device = resolve_device(resolved.model.device)
        path = resolve_model(resolved.model.target, progress=not quiet, what="model.target")
        hf, tok = load_model(path, device=device, dtype=resolved.model.dtype)
        folder = build_init(resolved, LeanLM.from_hf(hf), tok, path, device, progress=not quiet, console=None if quiet else console)
    except ValueError as e:
        _fail(str(e))
    info = init_info(folder) or {}
    table = Table(title=f"drafter init: {d.kind} on {d.init_data()}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key in ("num_sequences", "num_completion_tokens", "steps", "seconds"):
        table.add_row(key, str(info.get(key, "")))
    for when in ("held_out_before", "held_out_after"):
        for key, v in info.get(when, {}).items():
            table.add_row(f"{key} ({when.split('_')[-1]})", f"{v:.4f}")
    console.print(table)
    console.print(f"checkpoint: {folder}", soft_wrap=True, highlight=False)
