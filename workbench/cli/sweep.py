"""`wb sweep`: a grid of experiments with paired speedups."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from workbench.cli.common import _fail, _split_args, app, console, err
from workbench.runs import UnsearchableName
from workbench.specs import SpecError


@app.command(context_settings={"allow_extra_args": False})
def sweep(
    spec: Optional[str] = typer.Argument(
        None, help="Spec YAML path or a name under experiments/ (default: sweep = quickstart, 4 steps). May be omitted."
    ),
    axes: Optional[list[str]] = typer.Argument(
        None,
        help="KEY=LOW..HIGH (integers, inclusive), KEY=A,B,C (a list) or KEY=VALUE (fixed for every point). "
        "KEY: any dotted spec key, or k (drafter.k), drafter (drafter.kind), init (drafter.init.data).",
    ),
    name: Optional[str] = typer.Option(
        None,
        "--name",
        "-n",
        help="Sweep name (MLflow parent run). Re-use a name to resume: finished points are skipped.",
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="Run every point with N seeds (seed, seed+1, ...); the table pools them."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the points and exit; nothing runs."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress bars (point lines and the results table still print)."
    ),
    claim_timeout: float = typer.Option(
        60.0,
        "--claim-timeout",
        min=5.0,
        help="Seconds without a heartbeat after which another worker's claimed point counts as abandoned (its worker "
        "died) and is run again. Give every worker the same value.",
    ),
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Run the points as Ray tasks: local (a cluster on this machine), auto (the one `ray start` began, or "
        "$RAY_ADDRESS) or HOST:PORT. Ray places them (a GPU each for model.device=cuda) and reruns a point whose "
        "node died. Needs the ray extra.",
    ),
    cpus_per_point: float = typer.Option(
        1.0, "--cpus-per-point", min=0.1, help="With --ray: CPUs each point asks Ray for (its torch threads)."
    ),
) -> None:
    """Sweep a grid of experiments; each speculative point measures its speedup paired with autoregressive
    generation of the same prompts in the same steps (95 % CI), and a best point is named only when its CI clears the rest.

    Workers: start several wb sweep with the same arguments and --name (one machine or several, one MLflow store: tracking.tracking_uri=http://host:5000 for an MLflow server with a database backend). Each point is claimed by one worker (a RUNNING child run with a heartbeat) and run once; a worker killed mid-point leaves a claim that goes stale after --claim-timeout and is run again by another worker or a re-run. Each worker waits for the others' points, then prints the same table, read from MLflow.

    Examples: wb sweep k=1..7 | wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name s1
    """  # noqa: E501 (`wb sweep --help`: Rich keeps a paragraph's line breaks)
    from workbench.ray_cluster import ClusterError
    from workbench.sweep import SweepError, plan_sweep, plan_table, results_table, run_sweep
    from workbench.tracking import StoreError

    spec, items = _split_args(spec, axes)
    try:
        plan = plan_sweep(spec, items, repeats=repeats)
    except SpecError as e:
        _fail(str(e))
    if dry_run:
        console.print(plan_table(plan, f"sweep plan: {len(plan.points)} points (dry run: nothing runs)"))
        return
    try:
        res = run_sweep(
            plan,
            name=name,
            console=console,
            progress=not quiet,
            claim_timeout=claim_timeout,
            ray=ray,
            cpus_per_point=cpus_per_point,
        )
    except UnsearchableName as e:
        _fail(f"--name: {e}")
    except (SweepError, StoreError, ClusterError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted: sweep run marked KILLED; resume with the same command and --name "
            f"{escape(name or '<the sweep name above>')}[/]"
        )
        raise typer.Exit(130)
    console.print(results_table(plan, res.outcomes, f"sweep {res.name} ({res.status})"))
    if res.parent_run_id:
        console.print(
            f"MLflow parent run [bold]{res.parent_run_id}[/] in {res.tracking_uri}; resume or extend with --name "
            f"{escape(res.name)}"
        )
    if res.status != "FINISHED":
        raise typer.Exit(1)
