"""`wb drafter init` (train and cache a drafter initialisation) and `wb drafter export` (an eagle3 head for vLLM)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from workbench.cli.common import _fail, _load, console, drafter_app


@drafter_app.command("init", context_settings={"allow_extra_args": False})
def drafter_init(
    spec: Optional[str] = typer.Argument(
        None, help="Spec YAML path or name (default: quickstart). May be omitted when giving overrides."
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="Dotted-key overrides, e.g. drafter.kind=eagle3 drafter.init.data=chat"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Train the spec's drafter on its init data (in_domain | chat | a dataset) and cache the checkpoint."""
    resolved = _load(spec, overrides)
    d = resolved.drafter
    from drafters import drafter_class

    cls = drafter_class(d.kind)
    if d.init_data() == "none" or cls is None or not cls.trainable:
        _fail(
            f"drafter.init.data: nothing to initialise for drafter.kind={d.kind} with init.data={d.init_data()}; "
            "use drafter.kind=draft_model|mtp|eagle3 and drafter.init.data=in_domain|chat|<file>"
        )
    from workbench.drafter_init import build_init, init_info
    from workbench.grpo.build import resolve_device
    from workbench.models import load_model, resolve_model
    from workbench.rollout.model import LeanLM
    from workbench.specs.resolve import drafter_init_config

    try:
        device = resolve_device(resolved.model.device)
        path = resolve_model(resolved.model.target, progress=not quiet, what="model.target")
        hf, tok = load_model(path, device=device, dtype=resolved.model.dtype)
        folder = build_init(
            drafter_init_config(resolved),
            LeanLM.from_hf(hf, what="model.target"),
            tok,
            path,
            device,
            progress=not quiet,
            console=None if quiet else console,
        )
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


@drafter_app.command("export", context_settings={"allow_extra_args": False})
def drafter_export(
    out: str = typer.Argument(..., help="New folder for the exported head (config.json + model.safetensors)."),
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or name (default: quickstart)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. drafter.init.data=chat"),
) -> None:
    """Export the spec's eagle3 drafter (its init checkpoint, trained first if missing) in the layout vLLM
    serves for speculative_config.method=eagle3; load it back with drafter.model=OUT.

    Example: wb drafter export /tmp/eagle3-head drafter.kind=eagle3
    """
    from pathlib import Path

    from workbench.drafter_init import drafter_as_run
    from workbench.grpo.build import resolve_device
    from workbench.models import load_model, resolve_model
    from workbench.rollout.model import LeanLM
    from workbench.specs.resolve import drafter_init_config
    from workbench.vllm import export_eagle3

    if spec is not None and "=" in spec:
        overrides, spec = [spec, *(overrides or [])], None
    resolved = _load(spec, [*(overrides or [])])
    if resolved.drafter.kind != "eagle3":
        resolved = resolved.model_copy(update={"drafter": resolved.drafter.model_copy(update={"kind": "eagle3"})})
    if Path(out).exists() and any(Path(out).iterdir()):
        _fail(f"{out} exists and is not empty: give a new folder")
    try:
        device = resolve_device(resolved.model.device)
        path = resolve_model(resolved.model.target, what="model.target")
        hf, tok = load_model(path, device=device, dtype=resolved.model.dtype)
        lm = LeanLM.from_hf(hf, what="model.target")
        drafter = drafter_as_run(drafter_init_config(resolved), lm, tok, path, device, progress=True)
        folder = export_eagle3(drafter.net, lm.cfg, out)
    except ValueError as e:
        _fail(str(e))
    console.print(
        f"eagle3 head (layers {list(drafter.net.layer_ids)}, draft vocabulary {int(drafter.net.d2t.shape[0])} of "
        f'{lm.cfg.vocab_size}) -> {folder}; vLLM: speculative_config={{"method": "eagle3", "model": "{folder}"}}',
        highlight=False,
        soft_wrap=True,
    )
