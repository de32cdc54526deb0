"""The `wb` command (Typer + Rich)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from workbench.spec import SpecError, load_spec

app = typer.Typer(
    help="The speculation workbench: how much does exact speculative decoding speed up GRPO rollouts?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Embedded model presets: list and build (cached).", no_args_is_help=True)
app.add_typer(models_app, name="models")
console = Console()
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


@app.command(context_settings={"allow_extra_args": False})
def run(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted when giving overrides."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. drafter.kind=ngram drafter.k=5"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved spec and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or tables."),
) -> None:
    """Run one experiment: GRPO training whose rollouts come from the speculative rollout engine."""
    items = list(overrides or [])
    if spec is not None and "=" in spec:  # `wb run drafter.k=5`: no spec given, only overrides
        items.insert(0, spec)
        spec = None
    try:
        resolved = load_spec(spec, items)
    except SpecError as e:
        _fail(str(e))
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


@app.command(context_settings={"allow_extra_args": False})
def sweep(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ (default: sweep = quickstart, 4 steps). May be omitted."),
    axes: Optional[list[str]] = typer.Argument(
        None,
        help="KEY=LOW..HIGH (integers, inclusive), KEY=A,B,C (a list) or KEY=VALUE (fixed for every point). "
        "KEY: any dotted spec key, or k (drafter.k), drafter (drafter.kind), init (drafter.init.data).",
    ),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Sweep name (MLflow parent run). Re-use a name to resume: finished points are skipped."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the points and exit; nothing runs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (point lines and the results table still print)."),
) -> None:
    """Sweep a grid of experiments, each with its speedup over an autoregressive baseline.

    Examples: wb sweep k=1..7 | wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name s1
    """
    from workbench.sweep import plan_sweep, plan_table, results_table, run_sweep

    items = list(axes or [])
    if spec is not None and "=" in spec:  # `wb sweep k=1..7`: no spec given
        items.insert(0, spec)
        spec = None
    try:
        plan = plan_sweep(spec, items)
    except SpecError as e:
        _fail(str(e))
    if dry_run:
        console.print(plan_table(plan, f"sweep plan: {len(plan.points)} points (dry run: nothing runs)"))
        return
    try:
        res = run_sweep(plan, name=name, console=console, progress=not quiet)
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: sweep run marked KILLED; resume with the same command and --name {name or '<the sweep name above>'}[/]")
        raise typer.Exit(130)
    console.print(results_table(plan, res.outcomes, f"sweep {res.name} ({res.status})"))
    if res.parent_run_id:
        console.print(f"MLflow parent run [bold]{res.parent_run_id}[/] in {res.tracking_uri}; resume or extend with --name {res.name}")
    if res.status != "FINISHED":
        raise typer.Exit(1)


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


@app.command()
def bench(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or name (default: quickstart): target, draft model, task, sampling."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. rollout.temperature=0"),
    batch_sizes: str = typer.Option("1,8,64", help="Batch sizes for ours vs transformers generate()."),
    ks: str = typer.Option("1..7", "--k", help="Speculation lengths k (num_speculative_tokens)."),
    drafters: str = typer.Option("draft_model,ngram", help="Drafter kinds for the performance-model table."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens generated per sequence (EOS ignored)."),
    repeats: int = typer.Option(3, min=1, help="Timed repeats per measurement (median reported)."),
    model_batch: int = typer.Option(64, min=1, help="Batch of the performance-model table (the GRPO batch)."),
    no_hf: bool = typer.Option(False, "--no-hf", help="Skip the transformers contenders."),
    out: str = typer.Option("benchmarks", help="Folder for <name>.json and <name>.md."),
    name: Optional[str] = typer.Option(None, help="Result file name (default: bench-<device>-<date>)."),
) -> None:
    """Benchmark rollout generation: ours vs transformers generate() and assisted generation, and
    the performance model (measured α, c, verification cost; predicted vs measured speedup)."""
    import shlex
    import time as _time
    from pathlib import Path

    from workbench.bench import Bench, BenchConfig, machine_info, save, to_markdown

    items = list(overrides or [])
    if spec is not None and "=" in spec:
        items.insert(0, spec)
        spec = None
    try:
        resolved = load_spec(spec, items)
    except SpecError as e:
        _fail(str(e))
    from drafters import DRAFTERS

    kinds = tuple(x.strip() for x in drafters.split(",") if x.strip())
    bad = [x for x in kinds if x not in DRAFTERS]
    if bad:
        _fail(f"--drafters: unknown drafter {bad[0]!r}; allowed values: {', '.join(DRAFTERS)}")
    cfg = BenchConfig(_int_list(batch_sizes, "--batch-sizes"), _int_list(ks, "--k"), kinds, max_new_tokens, repeats, model_batch, not no_hf)
    try:
        b = Bench(resolved, cfg)
    except ValueError as e:
        _fail(str(e))
    with console.status("benchmarking") as status:
        results = b.run(progress=lambda s: status.update(f"benchmarking: {s}"))
    dev = machine_info()["device"].split(":")[0]
    fname = name or f"bench-{dev}-{_time.strftime('%Y%m%d-%H%M%S')}"
    args = [spec or "quickstart", *items, "--batch-sizes", batch_sizes, "--k", ks, "--drafters", drafters,
            "--max-new-tokens", str(max_new_tokens), "--repeats", str(repeats), "--model-batch", str(model_batch)]
    command = "wb bench " + " ".join(shlex.quote(a) for a in args + (["--no-hf"] if no_hf else []))
    jpath, mpath = save(results, Path(out), command, fname)
    from rich.markdown import Markdown

    console.print(Markdown(to_markdown(results | {"command": command})))
    console.print(f"results: {jpath} and {mpath}")


@models_app.command("list")
def models_list() -> None:
    """List model presets and whether each is built in the cache."""
    from workbench.models.build import build_info, cache_dir, is_built, list_presets, preset_dir

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


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
