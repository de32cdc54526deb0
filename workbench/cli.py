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


@app.command(context_settings={"allow_extra_args": False})
def tune(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ with a tune: section (default: tune). May be omitted."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides of the spec, e.g. grpo.steps=6 tune.objective=speedup_step"),
    trials: int = typer.Option(10, "--trials", "-t", min=1, help="Total COMPLETE+PRUNED trials the study should have; a re-run tops up (runs only the missing ones)."),
    study: Optional[str] = typer.Option(None, "--study", "-s", help="Optuna study name (default: tune.study_name or <spec name>-tune). Re-use it to resume."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL (default: tune.storage, sqlite:///optuna.db); any SQLAlchemy URL lets several machines share a study."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Where to write the best trial's spec YAML (default: ./best-<study>.yaml)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (trial lines and the results table still print)."),
) -> None:
    """Tune spec keys with an Optuna study: pruned on per-step values, resumable, best spec written as YAML.

    Search space: the spec's tune.params (dotted key -> {type: categorical|int|float, ...}). Objective (tune.objective, maximized): gen_tokens_per_s, speedup_gen or speedup_step, vs a drafter=none baseline run once per study. Each trial is an MLflow child run; pruned trials end FINISHED with tag workbench.pruned=true.

    Examples: wb tune --trials 20 | wb tune micro.yaml --trials 5 --study s1 --storage postgresql://host/optuna
    """
    items = list(overrides or [])
    if spec is not None and "=" in spec:  # `wb tune grpo.steps=6`: no spec given
        items.insert(0, spec)
        spec = None
    from workbench.tune import plan_tune, run_study, trials_table, write_best, best_trial

    try:
        plan = plan_tune(spec, items, study_name=study, storage=storage)
        res = run_study(plan, trials, console=console, progress=not quiet)
    except SpecError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: the running trial is marked FAIL; resume with the same command (--study {study or '<the study above>'})[/]")
        raise typer.Exit(130)
    console.print(trials_table(plan, res.study))
    best = best_trial(res.study)
    if res.parent_run_id:
        console.print(f"MLflow parent run [bold]{res.parent_run_id}[/] in {res.tracking_uri}")
    if best is None:
        err.print("[red]no trial completed[/]: nothing to write")
        raise typer.Exit(1)
    path = write_best(plan, best, out)
    params = " ".join(f"{k}={v}" for k, v in best.params.items())
    console.print(f"best trial [bold]{best.number}[/]: {plan.tune.objective} = [bold]{best.value:.4g}[/] with {params}")
    console.print(f"best spec written to [bold]{path}[/]; run it with: wb run {path}")


@app.command(context_settings={"allow_extra_args": False})
def report(
    name: str = typer.Argument(..., help="A sweep name, an Optuna study name, a run name or a run id."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output folder (default: reports/NAME)."),
    html: bool = typer.Option(False, "--html", help="Also write report.html."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."),
) -> None:
    """Write report.md (+ PNG plots, --html) for a sweep, study or run, read from MLflow.

    Examples: wb report my-sweep | wb report my-sweep --html --out /tmp/r | wb report <run id>
    """
    from workbench.report import ReportError, make_report

    try:
        target, rep = make_report(name, out, with_html=html, tracking_uri=tracking_uri)
    except ReportError as e:
        _fail(str(e))
    console.print(f"{target.kind} [bold]{name}[/]: {len(target.runs)} run(s) -> [bold]{rep.markdown}[/]" + (f", {rep.html}" if rep.html else ""))
    console.print(f"plots: {', '.join(rep.plots) or '(none)'}" + (f"; skipped (no data): {', '.join(rep.skipped)}" if rep.skipped else ""), highlight=False)


@app.command(context_settings={"allow_extra_args": False})
def ui(
    backend_store_uri: Optional[str] = typer.Option(None, "--backend-store-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (loopback by default)."),
    port: int = typer.Option(5000, "--port", "-p", help="Port."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Sweep/study (or parent run) whose child runs to compare (default: the newest)."),
    print_url: bool = typer.Option(False, "--print-url", "--no-server", help="Print the URLs and exit; start no server."),
    open_browser: bool = typer.Option(False, "--open", help="Open the comparison view in a web browser once the server is up."),
) -> None:
    """Start the MLflow UI on the workbench's store and print the comparison view of the last sweep."""
    import subprocess

    from workbench.ui import base_url, compare_url, default_store, experiment_url, find_group, server_command, wait_ready

    store = default_store(backend_store_uri)
    base = base_url(host, port)
    url = None
    try:
        group = find_group(store, sweep)
    except Exception as e:  # noqa: BLE001 - unreadable store
        if print_url:
            _fail(f"cannot read the MLflow store {store}: {e}")
        group = None
    if group is None:
        if sweep:
            _fail(f"no sweep, study or parent run {sweep!r} in {store}")
        console.print(f"no sweep in {store} yet; runs at {base}", highlight=False)
    else:
        parent, kids = group
        label = parent.data.tags.get("workbench.sweep") or parent.data.tags.get("workbench.study") or parent.info.run_name
        if kids:
            url = compare_url(base, [k.info.run_id for k in kids], [k.info.experiment_id for k in kids])
            console.print(f"compare the {len(kids)} runs of [bold]{label}[/]:", highlight=False)
            console.print(url, highlight=False, soft_wrap=True)
        console.print(f"experiment: {experiment_url(base, parent.info.experiment_id)}", highlight=False, soft_wrap=True)
    if print_url:
        return
    cmd = server_command(store, host, port)
    console.print(f"starting MLflow UI on {store} at {base} (Ctrl-C stops it)", highlight=False)
    proc = subprocess.Popen(cmd)
    try:
        if open_browser and wait_ready(base, 60, proc):
            import webbrowser

            webbrowser.open(url or base)
        raise typer.Exit(proc.wait())
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise typer.Exit(130)


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
