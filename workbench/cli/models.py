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
    from workbench.models import (
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
        params = f"{info['params'] / 1e6:.2f}M" if info and "params" in info else ""
        table.add_row(p.name, p.role, "yes" if info else "no", params, p.description)
    from workbench.models.imported import PRETRAINED, built_pretrained

    for p in PRETRAINED.values():  # real chat models from installed packages, converted on first use
        folder = built_pretrained(p.name)
        info = build_info(folder) if folder else None
        params = f"{info['params'] / 1e6:.2f}M" if info and "params" in info else ""
        table.add_row(p.name, "pretrained", "yes" if info else "no", params, f"{p.description} (`{p.install}`)")
    console.print(table)


@models_app.command("build")
def models_build(
    names: Optional[list[str]] = typer.Argument(
        None, help="Preset names (default: the quickstart's target and draft)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild into the cache even if built or shipped."),
) -> None:
    """Build presets into the cache (pretrain targets on the task format, distil drafts)."""
    from workbench.models import build_info, resolve_model

    if not names:
        s = load_spec(None)
        names = [s.model.target, s.drafter.model]
    for name in names:
        try:
            path = resolve_model(name, progress=True, what="preset", force=force)
        except ValueError as e:
            _fail(str(e))
        info = build_info(path) or {}
        shown = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
        console.print(f"[green]{name}[/] -> {path}  {shown}")


@models_app.command("init")
def models_init(
    arch: str = typer.Argument(..., help="Architecture: llama, llama3, qwen2, qwen3 or mistral."),
    out: str = typer.Argument(..., help="New folder for the checkpoint (config.json, safetensors, tokenizer)."),
    layers: int = typer.Option(2, "--layers", min=1, help="Decoder layers."),
    hidden: int = typer.Option(128, "--hidden", min=8, help="Hidden size."),
    heads: int = typer.Option(4, "--heads", min=1, help="Attention heads."),
    kv_heads: int = typer.Option(2, "--kv-heads", min=1, help="Key/value heads (grouped-query attention)."),
    head_dim: Optional[int] = typer.Option(
        None, "--head-dim", min=1, help="qwen3: per-head size (default 2 × hidden / heads)."
    ),
    intermediate: Optional[int] = typer.Option(
        None, "--intermediate", min=1, help="MLP intermediate size (default 2 × hidden)."
    ),
    seed: int = typer.Option(0, "--seed", help="Weight initialisation seed."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    vocab_size: Optional[int] = typer.Option(
        None,
        "--vocab-size",
        min=1,
        help="Widen the model's vocabulary to this many ids (e.g. 151936, Qwen3's) beyond the tokenizer's; the extra "
        "ids get random embeddings: a real-size LM head and probabilities, for benchmarks.",
    ),
) -> None:
    """Write a random checkpoint of a real architecture with the workbench's tokenizer (to try a shape:
    model.target=OUT or drafter.model=OUT).

    Example: wb models init qwen3 --layers 2 --hidden 128 /tmp/qwen3-tiny
    """
    from workbench.models.shapes import random_checkpoint

    if dtype not in ("float32", "bfloat16", "float16"):
        _fail(f"--dtype: {dtype!r}; allowed values: float32, bfloat16, float16")
    try:
        path = random_checkpoint(
            arch,
            out,
            seed=seed,
            dtype=dtype,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            min_vocab=vocab_size,
        )
    except ValueError as e:
        _fail(str(e))
    if vocab_size is not None:
        _widen_vocab(path, vocab_size, seed, dtype)
    console.print(
        f"[green]{arch}[/] random checkpoint -> {path}; use it with model.target={path} (or drafter.model={path})"
    )


def _widen_vocab(path, vocab_size: int, seed: int, dtype: str) -> None:
    """Resize the checkpoint's embeddings (and untied LM head) in ``path`` to ``vocab_size`` rows.

    Why: the workbench's tokenizer has 512 ids, which hides what a real vocabulary costs (an LM head
    of ~155 M parameters, float32 probabilities and top-p sorts over 151,936 ids, as Qwen's). The
    tokenizer never produces the extra ids; a random model samples them like any other."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))  # vocab_size checked before writing
    torch.manual_seed(seed + 1)  # the extra rows: deterministic, apart from the base weights' draws
    # mean_resizing=False: plain random rows (initializer_range), as the rest of the random model
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    model.save_pretrained(path)
