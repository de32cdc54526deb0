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
drafter_app = typer.Typer(help="Drafter initialisation: train a drafter on the target's completions (cached).", no_args_is_help=True)
app.add_typer(drafter_app, name="drafter")
console = Console()
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
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


@app.command(context_settings={"allow_extra_args": False})
def run(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted when giving overrides."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. drafter.kind=ngram drafter.k=5"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved spec and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or tables."),
) -> None:
    """Run one experiment: GRPO training whose rollouts come from the speculative rollout engine."""
    resolved = _load(spec, overrides)
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
    repeats: int = typer.Option(1, "--repeats", min=1, help="Run every point with N seeds (seed, seed+1, ...); the table pools them."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the points and exit; nothing runs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (point lines and the results table still print)."),
) -> None:
    """Sweep a grid of experiments; each speculative point measures its speedup paired with autoregressive
    generation of the same prompts in the same steps (95 % CI), and a best point is named only when its CI clears the rest.

    Examples: wb sweep k=1..7 | wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name s1
    """
    from workbench.sweep import plan_sweep, plan_table, results_table, run_sweep

    spec, items = _split_args(spec, axes)
    try:
        plan = plan_sweep(spec, items, repeats=repeats)
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
    compile_: bool = typer.Option(False, "--compile", help="torch.compile our engine's forwards (compilation happens in the untimed warm-up)."),
    out: str = typer.Option("benchmarks", help="Folder for <name>.json and <name>.md."),
    name: Optional[str] = typer.Option(None, help="Result file name (default: bench-<device>-<date>)."),
) -> None:
    """Benchmark rollout generation: ours vs transformers generate() and assisted generation, plus the performance model.

    The model table measures α, c and the verification cost per drafter and k, and compares the
    predicted speedup with the measured one. Results go to benchmarks/<name>.json and .md.
    """
    import shlex
    import time as _time
    from pathlib import Path

    from workbench.bench import Bench, BenchConfig, machine_info, save, to_markdown

    spec, items = _split_args(spec, overrides)
    resolved = _load(spec, items)
    from drafters import DRAFTERS

    kinds = tuple(x.strip() for x in drafters.split(",") if x.strip())
    bad = [x for x in kinds if x not in DRAFTERS]
    if bad:
        _fail(f"--drafters: unknown drafter {bad[0]!r}; allowed values: {', '.join(DRAFTERS)}")
    cfg = BenchConfig(_int_list(batch_sizes, "--batch-sizes"), _int_list(ks, "--k"), kinds, max_new_tokens, repeats, model_batch, not no_hf, compile_)
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
    command = "wb bench " + " ".join(shlex.quote(a) for a in args + (["--no-hf"] if no_hf else []) + (["--compile"] if compile_ else []))
    jpath, mpath = save(results, Path(out), command, fname)
    from rich.markdown import Markdown

    console.print(Markdown(to_markdown(results | {"command": command})))
    console.print(f"results: {jpath} and {mpath}")


@app.command(context_settings={"allow_extra_args": False})
def tune(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ with a tune: section (default: tune). May be omitted."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides of the spec, e.g. grpo.steps=6 tune.objective=speedup_step"),
    trials: int = typer.Option(10, "--trials", "-t", min=1, help="Total COMPLETE+PRUNED trials the study should have, counted over all its workers (never overshot); a re-run tops up."),
    study: Optional[str] = typer.Option(None, "--study", "-s", help="Optuna study name (default: tune.study_name or <spec name>-tune). Re-use it to resume."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL (default: tune.storage, sqlite:///optuna.db); any SQLAlchemy URL lets several machines share a study."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Where to write the best trial's spec YAML (default: ./best-<study>.yaml)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (trial lines and the results table still print)."),
) -> None:
    """Tune spec keys with an Optuna study: pruned on per-step values, resumable, best spec written as YAML.

    Search space: the spec's tune.params (dotted key -> {type: categorical|int|float, ...}). Objective (tune.objective, maximized): gen_tokens_per_s, or speedup_gen / speedup_step: the geometric mean, with a 95 % CI, of the paired per-step speedups after warm-up (each step also times autoregressive generation of the same prompts; no study-level baseline; drafter none = 1.0). Each trial is an MLflow child run; pruned trials end FINISHED with tag workbench.pruned=true.

    Workers: start several wb tune with the same --study and --storage (one machine or several): they share the --trials total, each trial records its host, and each worker waits for the others, then prints the same table read from storage. A killed worker's trial is failed after its heartbeat stops (60 s).

    Examples: wb tune --trials 20 | wb tune micro.yaml --trials 5 --study s1 --storage postgresql://host/optuna
    """
    spec, items = _split_args(spec, overrides)
    from workbench.tune import best_trial, fmt_score, plan_tune, run_study, trial_score, trials_table, write_best

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
    console.print(f"best trial [bold]{best.number}[/]: {plan.tune.objective} = [bold]{fmt_score(trial_score(best))}[/] with {params}")
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
    port: int = typer.Option(5000, "--port", "-p", min=1, max=65535, help="Port."),
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
        label = parent.tags.get("workbench.sweep") or parent.tags.get("workbench.study") or parent.name
        if kids:
            url = compare_url(base, [k.run_id for k in kids], [k.experiment_id for k in kids])
            console.print(f"compare the {len(kids)} runs of [bold]{label}[/]:", highlight=False)
            console.print(url, highlight=False, soft_wrap=True)
        console.print(f"experiment: {experiment_url(base, parent.experiment_id)}", highlight=False, soft_wrap=True)
    if print_url:
        return
    cmd = server_command(store, host, port)
    console.print(f"starting MLflow UI on {store} at {base} (Ctrl-C stops it)", highlight=False)
    import signal

    def _term(*_):  # `kill` of wb stops the server too
        raise KeyboardInterrupt

    proc = subprocess.Popen(cmd)
    old = signal.signal(signal.SIGTERM, _term)
    code = 130
    try:
        if open_browser and wait_ready(base, 60, proc):
            import webbrowser

            webbrowser.open(url or base)
        code = proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": False})
def audit(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. rollout.temperature=0.7 drafter.k=2"),
    alpha: float = typer.Option(1e-3, "--alpha", min=1e-12, max=0.5, help="Family-wise false-alarm rate (Bonferroni over all chi-square tests)."),
    samples: int = typer.Option(0, "--samples", "-n", min=0, help="Rows per drafter and prompt; 0 = sized for a 1 % shift (power 0.9), capped by --max-samples."),
    max_samples: int = typer.Option(0, "--max-samples", min=0, help="Cap on the auto sample size (0 = no cap: a 1 % shift)."),
    prompts: int = typer.Option(1, "--prompts", min=1, help="Task eval prompts for the sampled tests (the greedy check uses at least 8)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="Completion tokens per row (positions tested); default k+2: the prefill token and one whole verification step."),
    k: Optional[int] = typer.Option(None, "--k", help="Speculation length (default: the spec's drafter.k)."),
    drafters_opt: Optional[str] = typer.Option(None, "--drafters", help="Comma-separated drafter kinds (default: every registered kind)."),
    biased: bool = typer.Option(False, "--biased", hidden=True, help="Debug: verify with a sampler that accepts every draft (the audit must fail)."),
) -> None:
    """Check that speculative rollouts follow the target's distribution, per drafter (exits 1 on a failure).

    Tests speculative samples against the target's exact law (teacher-forced conditionals):
    per-position token histograms and the joint law of the first two tokens (chi-square
    goodness of fit, Bonferroni to --alpha), and greedy token-for-token identity.
    Example: wb audit micro --samples 2000
    """
    from drafters import DRAFTERS
    from workbench.drafter_init import drafter_as_run
    from workbench.audit import accept_all_rejection_sample, informative_prompts, plan, run_audit, summary_rows
    from workbench.grpo.trainer import resolve_device
    from workbench.models.build import PRESETS, is_built, load_model, resolve_model
    from workbench.models.tokenizer import encode_prompt
    from workbench.rollout.model import LeanLM
    from workbench.rollout.sampling import SamplingParams
    from workbench.tasks.loading import load_task_data

    s = _load(spec, overrides)
    kinds = [x.strip() for x in drafters_opt.split(",")] if drafters_opt else list(DRAFTERS)
    unknown = [x for x in kinds if x not in DRAFTERS]
    if unknown:
        _fail(f"--drafters: unknown kind(s) {', '.join(unknown)}; registered: {', '.join(DRAFTERS)}")
    try:
        device = resolve_device(s.model.device)
        hf, tok = load_model(resolve_model(s.model.target, what="model.target"), device=device, dtype=s.model.dtype)
        t = s.task
        split = "eval" if t.num_eval else "train"
        rows = load_task_data(t.name, split, max(prompts, 8), s.seed, t.path, t.prompt_field, t.answer_field)
    except ValueError as e:
        _fail(str(e))
    lm = LeanLM.from_hf(hf)
    all_ids = [encode_prompt(tok, r["prompt"]) for r in rows]
    prompt_ids = all_ids[:prompts]
    drafters, skipped = {}, {}
    for kind in kinds:
        if kind == "draft_model" and s.drafter.model in PRESETS and not is_built(s.drafter.model):
            skipped[kind] = f"preset {s.drafter.model} not built (wb models build {s.drafter.model})"
            continue
        try:
            # each kind as the spec would run it: its drafter init (cached; built here if missing)
            ks = s.model_copy(update={"drafter": s.drafter.model_copy(update={"kind": kind})})
            drafters[kind] = drafter_as_run(ks, lm, tok, resolve_model(s.model.target, what="model.target"), device, progress=True)
        except (ValueError, NotImplementedError, ImportError, OSError, TypeError) as e:
            skipped[kind] = str(e).splitlines()[0][:120]
    r = s.rollout
    kk = k or s.drafter.k
    max_new_tokens = max_new_tokens or kk + 2
    sp = SamplingParams(r.temperature, r.top_p, r.top_k, max_new_tokens, tok.eos_token_id)
    m, a, n_req = plan(len(drafters), len(prompt_ids), max_new_tokens, alpha)
    n = samples or (min(n_req, max_samples) if max_samples else n_req)
    console.print(
        f"audit: target {s.model.target}, drafters {', '.join(drafters) or '-'}, k={kk}, {len(prompt_ids)} prompts, "
        f"{max_new_tokens} tokens, T={sp.temperature} top_p={sp.top_p} top_k={sp.top_k}{' [red](biased sampler)[/]' if biased else ''}\n"
        f"{m} chi-square tests against the target's exact law, Bonferroni: each at {a:.1e} (family-wise false-alarm rate {alpha:g}); "
        f"n for a 1 % shift at p=0.5, power 0.9: {n_req} rows per drafter and prompt; using n={n}",
        highlight=False,
    )
    with console.status("sampling") as status:
        status.update("pilot: finding uncertain positions")
        contexts = informative_prompts(lm, prompt_ids, sp, seed=s.seed)
        res = run_audit(lm, drafters, contexts, sp, k=kk, n=n, alpha=alpha, skipped=skipped, greedy_prompts=all_ids,
                        rejection_fn=accept_all_rejection_sample if biased else None,
                        on_progress=lambda msg: status.update(msg))
    table = Table(title=f"audit ({res.wall_s:.0f} s): detectable shift at n={n}: {100 * res.shift:.1f} % (1 df, p=0.5, power 0.9)")
    for col in ("drafter", "test", "min p (over prompts)", "result", "detail (worst)"):
        table.add_column(col)
    for d, name, p, ok, detail in summary_rows(res):
        table.add_row(d, name, p, f"[green]{ok}[/]" if ok == "pass" else f"[bold red]{ok}[/]", detail)
    for kind, why in res.skipped.items():
        table.add_row(kind, "-", "-", "[yellow]skipped[/]", why)
    console.print(table)
    console.print("contexts (prompt + target's own prefix up to its first uncertain position): "
                  + " | ".join(repr(tok.decode(c)[-40:]) for c in contexts), highlight=False)
    if res.acceptance:
        console.print("acceptance rate: " + ", ".join(f"{d} {v:.2f}" for d, v in res.acceptance.items()), highlight=False)
    if not res.passed:
        err.print("[bold red]audit FAILED:[/] speculative rollouts differ from autoregressive ones")
        raise typer.Exit(1)
    console.print("[green]audit passed[/]")


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


@app.command(context_settings={"allow_extra_args": False})
def project(
    gen: Optional[float] = typer.Option(None, "--gen", help="Seconds of the gen stage per step (autoregressive)."),
    logprob: float = typer.Option(0.0, "--logprob", min=0.0, help="Seconds of the logprob stage."),
    train: float = typer.Option(0.0, "--train", min=0.0, help="Seconds of the train stage."),
    prepare: float = typer.Option(0.0, "--prepare", min=0.0, help="Seconds of the prepare stage (weight sync)."),
    data: float = typer.Option(0.0, "--data", min=0.0, help="Seconds of the data stage."),
    other: float = typer.Option(0.0, "--other", min=0.0, help="Other seconds per step (draft_train, reward, untimed)."),
    run_ref: Optional[str] = typer.Option(None, "--run", help="MLflow run id or name: stage times = mean timing_s/<stage>, α from spec/acceptance_rate_pos_<i>."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."),
    alpha: Optional[list[str]] = typer.Option(None, "--alpha", help="Per-token acceptance α, or DRAFTER=α (repeatable)."),
    per_pos: Optional[str] = typer.Option(None, "--per-pos", help="Per-position acceptance rates 'r0,r1,..' (α fitted from r_i ≈ α^(i+1))."),
    c: Optional[list[str]] = typer.Option(None, "--c", help="Drafter/target step cost ratio, or DRAFTER=c (repeatable; default 0.05)."),
    ks: str = typer.Option("1..8", "--k", help="Speculation lengths: LOW..HIGH or a,b,c."),
    cost_curve: Optional[str] = typer.Option(None, "--cost-curve", help="JSON/CSV of target forward seconds vs tokens in flight."),
    params: Optional[float] = typer.Option(None, "--params", help="Roofline: target parameter count (e.g. 8e9)."),
    flops: float = typer.Option(989e12, "--flops", min=1.0, help="Roofline: GPU FLOP/s (default H100 dense bf16)."),
    bandwidth: float = typer.Option(3.35e12, "--bandwidth", min=1.0, help="Roofline: GPU memory bandwidth, bytes/s (default H100)."),
    bytes_per_param: float = typer.Option(2.0, "--bytes-per-param", min=0.01, help="Roofline: bytes per weight."),
    batch: int = typer.Option(256, "--batch", min=1, help="Rows decoded together (tokens in flight per decode step)."),
    staleness: int = typer.Option(3, "--staleness", min=0, help="Async model: show staleness 1..N."),
    cv: float = typer.Option(0.2, "--cv", min=0.0, help="Async model: coefficient of variation of the per-step gen time."),
    seeds: bool = typer.Option(False, "--seeds", help="Print the check against DESIGN.md §6's published numbers and exit."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Check the model on a measured sweep (MLflow sweep name): predicted vs measured step speedup per point."),
    costs: Optional[str] = typer.Option(None, "--costs", help="--sweep: step costs and lengths from a --save-costs JSON instead of the engine microbenchmark."),
    save_costs: Optional[str] = typer.Option(None, "--save-costs", help="--sweep: write the microbenchmark's step costs and lengths to this JSON."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="--sweep: torch threads for the microbenchmark (match the sweep's; default: torch's)."),
    reps: int = typer.Option(3, "--reps", min=1, help="--sweep: repeats per microbenchmark timing (the fastest counts)."),
    tolerance: float = typer.Option(0.10, "--tolerance", min=0.0, help="--sweep: relative error of the step speedup that passes."),
    load_adjust: bool = typer.Option(False, "--load-adjust", help="--sweep: scale each point's predicted gen by its non-gen s / the baseline's (machine speed during the point)."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Fit the unknown cost (--unknown c|knee) to one measured point (--k K, its acceptance, --gen-speedup S) and predict k=1..7."),
    gen_speedup: Optional[float] = typer.Option(None, "--gen-speedup", min=0.0, help="--calibrate: the measured gen speedup at --k (e.g. speedup/gen of a paired run)."),
    acceptance_length: Optional[float] = typer.Option(None, "--acceptance-length", min=1.0, help="--calibrate: the measured acceptance length at --k (α from inverting E[N])."),
    unknown: str = typer.Option("c", "--unknown", help="--calibrate: what to fit: c (drafter/target step cost) or knee (tokens in flight where verification turns compute-bound)."),
    knee: Optional[float] = typer.Option(None, "--knee", min=1.0, help="--calibrate --unknown c: the roofline knee in tokens in flight (default: memory-bound, verification = 1 step)."),
) -> None:
    """Project gen and step speedups per drafter and k, the best k, and async overlap (a performance model).

    Examples: wb project --gen 100 --logprob 20 --train 15 --alpha 0.8 --c 0.05 |
    wb project --run my-run --params 8e9 --batch 64 | wb project --seeds | wb project --sweep note-1 |
    wb project --calibrate --k 3 --acceptance-length 2.4 --gen-speedup 1.6
    """
    from workbench import project as pm

    if calibrate:
        from workbench.calibrate import run_cli

        try:
            return run_cli(console, ks, gen_speedup, acceptance_length, per_pos, alpha, unknown, c, knee, batch)
        except ValueError as e:
            _fail(str(e))

    if (costs or save_costs) and not sweep:
        _fail("--costs and --save-costs go with --sweep NAME")
    if sweep and cost_curve:
        _fail("--cost-curve is the target-forward curve of a projection; with --sweep the step costs come from the engine "
              "microbenchmark or --costs FILE (written by --save-costs)")
    if sweep:
        try:
            runs, uri = pm.load_sweep(sweep, tracking_uri)
        except ValueError as e:
            _fail(str(e))
        finished = [r for r in runs if r.status == "FINISHED"]
        skipped = [f"{r.label()}: {r.status.lower()}" for r in runs if r.status != "FINISHED"]
        pairs = []
        for r in finished:
            if r.is_baseline:
                continue
            b = pm.baseline_for(r, finished)
            miss = pm.missing_metrics(r) + (pm.missing_metrics(b) if b else [])
            if b is None or miss:
                skipped.append(f"{r.label()}: " + ("no finished drafter=none baseline with the same settings" if b is None else "no " + ", ".join(miss)))
            else:
                pairs.append((r, b))
        if not pairs:
            _fail(f"sweep {sweep!r}: no point with a baseline to check" + (" (" + "; ".join(skipped) + ")" if skipped else ""))
        if costs:
            try:
                step_costs, lengths, meta = pm.load_costs(costs)
            except (OSError, ValueError, KeyError) as e:
                _fail(f"--costs: {e}")
            source = f"--costs {costs}" + (f" (measured {meta.get('date', '?')}, {meta.get('threads', '?')} threads)" if meta else "")
        else:
            import time

            import torch

            if threads:
                torch.set_num_threads(threads)
            bench = pm.EngineBench(reps=reps)
            lengths = {}
            with console.status("engine microbenchmark") as st:
                for r, b in pairs:
                    wk = pm.workload_key(b.params)
                    if wk not in lengths:
                        st.update(f"sampling completion lengths ({b.params.get('model.target')}, {b.rows} rows × {bench.length_batches})")
                        lengths[wk] = bench.lengths(b)
                step_costs = bench.step_costs(list({r.run_id: r for pair in pairs for r in pair}.values()), progress=st.update)
            meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(), "reps": reps,
                    "device": "cuda" if torch.cuda.is_available() else "cpu"}
            source = f"engine microbenchmark, torch {torch.get_num_threads()} thread(s), fastest of {reps}"
            if save_costs:
                pm.save_costs(save_costs, step_costs, lengths, meta)
        preds = []
        for r, b in pairs:
            ck, bk, wk = pm.config_key(r.params), pm.config_key(b.params), pm.workload_key(b.params)
            if ck not in step_costs or bk not in step_costs or wk not in lengths:
                skipped.append(f"{r.label()}: no step cost / lengths for {ck if ck not in step_costs else bk if bk not in step_costs else wk!r}")
                continue
            preds.append(pm.predict_point(r, b, step_costs[ck], step_costs[bk], lengths[wk], load_adjust=load_adjust))
        c = Table(title=f"step costs ({source})")
        for col in ("config", "per batch ms", "per step ms (a)", "per row·step µs (b)", "measured ms/step at n rows"):
            c.add_column(col, justify="left" if col in ("config", "measured ms/step at n rows") else "right")
        for key in dict.fromkeys(k for r, b in pairs for k in (pm.config_key(b.params), pm.config_key(r.params))):
            if key in step_costs:
                sc = step_costs[key]
                c.add_row(key, f"{sc.prefill * 1e3:.1f}", f"{sc.a * 1e3:.2f}", f"{sc.b * 1e6:.1f}",
                          " ".join(f"{n}:{v * 1e3:.2f}" for n, v in sc.grid.items()))
        console.print(c)
        for wk, bl in lengths.items():
            flat = [x for bb in bl for x in bb]
            if flat:
                console.print(f"completion lengths sampled by the target ({len(bl)} batches): mean {sum(flat) / len(flat):.1f}, "
                              f"max per batch {', '.join(str(max(bb)) for bb in bl)}", highlight=False)
        from rich import box

        t = Table(title=f"sweep {sweep}: measured vs predicted step speedup (tolerance {tolerance:.0%}"
                  + (", gen pred × non-gen × (--load-adjust))" if load_adjust else ")"), box=box.SIMPLE_HEAD,
                  caption="E[N] = 1 + Σ per-position acceptance rates (used directly, no geometric α); undrafted: row-steps without a "
                  "draft; S: verification steps per GRPO step (simulated), n̄ = R / S rows in flight; cost/step: one step at n̄ over one "
                  "autoregressive step at the baseline's n̄; gen pred = baseline gen × model(point) / model(baseline); step pred = "
                  "point's non-gen s + gen pred; non-gen ×: point's non-gen s / baseline's (speculation does not change them: "
                  "far from 1 = the machine's speed changed between the runs)")
        for col in ("drafter", "k", "E[N]", "undrafted", "S", "n̄", "cost/step", "gen s", "gen s pred", "non-gen ×", "step ×", "step × pred", "error", "within"):
            t.add_column(col, justify="left" if col in ("drafter", "within") else "right", no_wrap=True)
        base_done = set()
        for p in preds:
            if p.base.run_id not in base_done:
                base_done.add(p.base.run_id)
                t.add_row("none", "-", "1.00", "-", f"{p.base_steps:.1f}", f"{p.base_row_steps / max(p.base_steps, 1e-9):.1f}", "1.00",
                          f"{p.base.gen:.3f}", "(ref)", "1.00", "1.00", "(ref)", "-", "-")
            t.add_row(p.run.kind, str(p.run.k), f"{p.tokens_per_step:.2f}", f"{p.no_draft:.0%}", f"{p.steps:.1f}",
                      f"{p.row_steps / max(p.steps, 1e-9):.1f}", f"{p.step_cost_ratio:.2f}", f"{p.gen_meas:.3f}", f"{p.gen_pred:.3f}",
                      f"{p.non_gen_ratio:.2f}", f"{p.speedup_meas:.3f}", f"{p.speedup_pred:.3f}", f"{p.error:+.1%}",
                      "[green]✓ pass[/]" if p.within(tolerance) else "[red]✗ FAIL[/]")
        console.print(t)
        for p in {p.base.run_id: p for p in preds}.values():
            console.print(f"calibration: the microbenchmark's gen of the baseline {p.model_gen_base:.3f} s vs measured {p.base.gen:.3f} s "
                          f"(×{p.base.gen / p.model_gen_base:.2f} applied to its points)", highlight=False)
        for s_ in skipped:
            console.print(f"[yellow]not checked[/] {s_}", highlight=False)
        n_ok = sum(p.within(tolerance) for p in preds)
        console.print(f"{n_ok}/{len(preds)} points within {tolerance:.0%} (step speedup, store {uri})", highlight=False)
        return

    if seeds:
        rows = pm.seeds_check()
        t = Table(title="DESIGN.md §6 seeds: projected vs published step speedup (tolerance 0.02)")
        t.add_column("quantity")
        for r in rows:
            t.add_column(r["seed"], justify="right")
        fields = [("gen s (autoregressive → speculative)", lambda r: f"{r['gen_s']:.1f} → {r['gen_spec_s']:.1f}"),
                  ("gen speedup S (published)", lambda r: f"{r['gen_speedup']:.3f} ({r['published_gen_speedup']})"),
                  ("non-gen s (backed out)", lambda r: f"{r['non_gen_s']:.2f}"),
                  ("gen fraction of the step", lambda r: f"{r['gen_fraction']:.3f}"),
                  ("projected step speedup", lambda r: f"{r['step_speedup']:.3f}"),
                  ("gen fraction clamped to §6's 65–72 %", lambda r: f"{r['gen_fraction_in_range']:.2f}"),
                  ("projected step speedup (that fraction)", lambda r: f"{r['step_speedup_in_range']:.3f}"),
                  ("published step speedup", lambda r: f"{r['published']:.2f}"),
                  ("within 0.02", lambda r: "[green]yes[/]" if r["ok"] else "[red]NO[/]")]
        for label, fn in fields:
            t.add_row(label, *(fn(r) for r in rows))
        console.print(t)
        console.print("non-gen s: backed out of gen times and the published step speedup; frac §6: gen fraction clamped to "
                      "§6's 65–72 % range; step × = step / (step − gen + gen/S) with S = gen/spec gen", highlight=False)
        if not all(r["ok"] for r in rows):
            raise typer.Exit(1)
        return
    stages: dict[str, float] = {}
    info: dict = {}
    if run_ref:
        try:
            stages, info = pm.stages_from_mlflow(run_ref, tracking_uri)
        except ValueError as e:
            _fail(str(e))
    cli_stages = dict(gen=gen, logprob=logprob, train=train, prepare=prepare, data=data, other=other)
    for key, v in cli_stages.items():
        if v is not None and (v or key not in stages):
            stages[key] = v
    if stages.get("gen") is None or stages["gen"] <= 0:
        _fail("give the gen stage time (--gen SECONDS) or an MLflow run (--run ID_OR_NAME)")
    alphas = _named_floats(alpha, "--alpha")
    if per_pos:
        try:
            alphas.setdefault(info.get("drafter", ""), pm.alpha_from_per_position([float(x) for x in per_pos.split(",")]))
        except ValueError:
            _fail(f"--per-pos: {per_pos!r} is not comma-separated numbers")
    if not alphas and info.get("per_pos"):
        alphas[info["drafter"]] = pm.alpha_from_per_position(info["per_pos"])
    if not alphas:
        _fail("give --alpha, --per-pos, or an MLflow run with spec/acceptance_rate_pos_<i> metrics")
    if "" in alphas and len(alphas) > 1:
        alphas["drafter"] = alphas.pop("")
    alphas = {(d or "drafter"): a for d, a in alphas.items()}
    cvals = _named_floats(c, "--c")
    cs = {d: cvals.get(d, cvals.get("", 0.05)) for d in alphas}
    try:
        k_list = list(_int_list(ks, "--k")) if ".." not in ks else list(range(int(ks.split("..")[0]), int(ks.split("..")[1]) + 1))
    except (ValueError, typer.Exit):
        _fail(f"--k: {ks!r} is not LOW..HIGH or a,b,c")
    if cost_curve:
        try:
            cost = pm.load_cost_curve(cost_curve)
        except (OSError, ValueError, KeyError) as e:
            _fail(f"--cost-curve: {e}")
        cost_desc = f"measured curve {cost_curve}"
    elif params:
        cost = pm.CostModel("roofline", params=params, flops=flops, bandwidth=bandwidth, bytes_per_param=bytes_per_param)
        cost_desc = f"roofline {params:.3g} params, {flops:.3g} FLOP/s, {bandwidth:.3g} B/s"
    else:
        cost = pm.CostModel()
        cost_desc = "memory-bound (verification = 1 target step)"
    rows = pm.project(stages, alphas, cs, k_list, cost, batch)
    step = sum(stages.values())
    console.print(f"step {step:.2f} s = " + " + ".join(f"{k} {v:.2f}" for k, v in stages.items() if v) + f"; cost model: {cost_desc}; batch {batch}", highlight=False)
    best = pm.best_k(rows)
    t = Table(title="synchronous step: projected speedups (Leviathan, S = E[N] / (k·c + verify))")
    for col in ("drafter", "k", "α", "c", "E[N]", "verify/step", "gen ×", "gen s", "step s", "step ×"):
        t.add_column(col)
    for r in rows:
        mark = " *" if best[r.drafter] is r else ""
        t.add_row(r.drafter, f"{r.k}{mark}", f"{r.alpha:.3f}", f"{r.c:.3g}", f"{r.expected_tokens:.2f}", f"{r.verify_ratio:.2f}",
                  f"{r.gen_speedup:.2f}", f"{r.gen_s:.2f}", f"{r.step_s:.2f}", f"{r.step_speedup:.2f}")
    console.print(t)
    train_side = step - stages["gen"]
    a = Table(title=f"asynchronous overlap (gen ‖ train side {train_side:.2f} s, gen cv {cv}): mean step s (× vs sync autoregressive {step:.2f} s)")
    a.add_column("staleness")
    a.add_column("autoregressive")
    for d, r in best.items():
        a.add_column(f"{d} k={r.k}")
    for s in range(0, staleness + 1):
        ar = pm.async_step_time(stages["gen"], train_side, s, cv)
        cells = [f"{ar:.2f} ({step / ar:.2f}×)"]
        for d, r in best.items():
            v = pm.async_step_time(r.gen_s, train_side, s, cv)
            cells.append(f"{v:.2f} ({step / v:.2f}×)")
        a.add_row("0 (sync)" if s == 0 else str(s), *cells)
    console.print(a)
    console.print("best k: " + ", ".join(f"{d} k={r.k} (gen {r.gen_speedup:.2f}×, step {r.step_speedup:.2f}×)" for d, r in best.items()), highlight=False)


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


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
