"""`wb tune`: an Optuna study over the spec's `tune:` section."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from workbench.cli.common import _fail, _split_args, app, console, err
from workbench.specs import SpecError


@app.command(context_settings={"allow_extra_args": False})
def tune(
    spec: Optional[str] = typer.Argument(
        None, help="Spec YAML path or a name under experiments/ with a tune: section (default: tune). May be omitted."
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="Dotted-key overrides of the spec, e.g. grpo.steps=6 tune.objective=speedup_step"
    ),
    trials: int = typer.Option(
        10,
        "--trials",
        "-t",
        min=1,
        help="Total COMPLETE+PRUNED trials the study should have, counted over all its workers (never overshot); a "
        "re-run tops up.",
    ),
    study: Optional[str] = typer.Option(
        None,
        "--study",
        "-s",
        help="Optuna study name (default: tune.study_name or <spec name>-tune). Re-use it to resume.",
    ),
    storage: Optional[str] = typer.Option(
        None,
        "--storage",
        help="Optuna storage URL (default: tune.storage, sqlite:///optuna.db); any SQLAlchemy URL lets several "
        "machines share a study.",
    ),
    out: Optional[str] = typer.Option(
        None, "--out", "-o", help="Where to write the best trial's spec YAML (default: ./best-<study>.yaml)."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress bars (trial lines and the results table still print)."
    ),
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Run the trials as Ray tasks, as many at once as the cluster holds: local, auto (the cluster `ray start` "
        "began, or $RAY_ADDRESS) or HOST:PORT. The storage and MLflow store must be reachable from every node "
        "(PostgreSQL). Needs the ray extra.",
    ),
    cpus_per_trial: float = typer.Option(
        1.0, "--cpus-per-trial", min=0.1, help="With --ray: CPUs each trial asks Ray for (its torch threads)."
    ),
) -> None:
    """Tune spec keys with an Optuna study: pruned on per-step values, resumable, best spec written as YAML.

    Search space: the spec's tune.params (dotted key -> {type: categorical|int|float, ...}). Objective (tune.objective, maximized): gen_tokens_per_s, or speedup_gen / speedup_step: the geometric mean, with a 95 % CI, of the paired per-step speedups after warm-up (each step also times autoregressive generation of the same prompts; no study-level baseline; drafter none = 1.0). Each trial is an MLflow child run; pruned trials end FINISHED with tag workbench.pruned=true.

    Workers: start several wb tune with the same --study and --storage (one machine or several): they share the --trials total, each trial records its host, and each worker waits for the others, then prints the same table read from storage. A killed worker's trial is failed after its heartbeat stops (60 s).

    Examples: wb tune --trials 20 | wb tune micro.yaml --trials 5 --study s1 --storage postgresql://host/optuna
    """  # noqa: E501 (`wb tune --help`: Rich keeps a paragraph's line breaks)
    spec, items = _split_args(spec, overrides)
    from workbench.ray_cluster import ClusterError
    from workbench.tracking import StoreError
    from workbench.tune import (
        best_trial,
        fmt_score,
        plan_tune,
        run_study,
        trial_score,
        trials_table,
        write_best,
    )

    try:
        plan = plan_tune(spec, items, study_name=study, storage=storage)
        res = run_study(plan, trials, console=console, progress=not quiet, ray=ray, cpus_per_trial=cpus_per_trial)
    except (SpecError, ClusterError, StoreError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted: the running trial is marked FAIL; resume with the same command (--study "
            f"{escape(study or '<the study above>')})[/]"
        )
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
    console.print(
        f"best trial [bold]{best.number}[/]: {plan.tune.objective} = [bold]{fmt_score(trial_score(best))}[/] with "
        f"{params}"
    )
    console.print(f"best spec written to [bold]{escape(str(path))}[/]; run it with: wb run {escape(str(path))}")
