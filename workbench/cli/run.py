"""`wb run`: one experiment (GRPO with speculative rollouts), one MLflow run."""

from __future__ import annotations

import subprocess
from typing import Optional

import typer
from rich.syntax import Syntax

from workbench.cli.common import _fail, _load, app, console, err


@app.command(context_settings={"allow_extra_args": False})
def run(
    spec: Optional[str] = typer.Argument(
        None,
        help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted when giving overrides.",
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="Dotted-key overrides, e.g. drafter.kind=ngram drafter.k=5"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved spec and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or tables."),
    nproc: int = typer.Option(
        1,
        "--nproc",
        min=1,
        help="Data-parallel ranks on this machine, started by torch.distributed's "
        "launcher (torchrun); needs grpo.backend=deepspeed. One MLflow run, logged by rank 0.",
    ),
) -> None:
    """Run one experiment: GRPO training whose rollouts come from the speculative rollout engine."""
    resolved = _load(spec, overrides)
    if dry_run:
        console.print(Syntax(resolved.to_yaml(), "yaml", theme="ansi_dark", background_color="default"))
        return
    if nproc > 1:
        raise typer.Exit(
            _launch(resolved, nproc, [a for a in [spec, *(overrides or [])] if a] + (["--quiet"] if quiet else []))
        )
    from workbench.grpo.distributed import exit_rank, launched_world_size

    try:
        _run(resolved, quiet)
    except typer.Exit as e:
        if launched_world_size() > 1:  # a rank torchrun started: end it without the interpreter's teardown
            exit_rank(e.exit_code)
        raise
    if launched_world_size() > 1:
        exit_rank(0)


def _run(resolved, quiet: bool) -> None:
    """The experiment in this process; the errors as `wb` reports them (typer.Exit with the exit code)."""
    from workbench.experiment import run_experiment
    from workbench.grpo.drafter_health import DrafterCollapse

    try:
        run_experiment(resolved, console=console, progress=not quiet)
    except KeyboardInterrupt as e:
        run_id = getattr(e, "mlflow_run_id", None)  # set by the Tracker that marked its run KILLED
        err.print(
            f"[yellow]interrupted: MLflow run {run_id} marked KILLED[/]"
            if run_id
            else "[yellow]interrupted before an MLflow run was opened: nothing to mark[/]"
        )
        raise typer.Exit(130)
    except DrafterCollapse as e:  # drafter.on_collapse=fail: the MLflow run is marked FAILED
        err.print(f"[bold red]run FAILED:[/] {e}", highlight=False)
        raise typer.Exit(1)
    except ValueError as e:  # bad input found while preparing (checkpoint, data file, tokenizer)
        _fail(str(e))
    except ImportError as e:  # rollout.backend=vllm without vLLM: the message names the extra to install
        _fail(str(e))


def _launch(resolved, nproc: int, args: list[str]) -> int:
    """``wb run --nproc N``: hand the ranks to torch.distributed's elastic launcher (torchrun
    ``--standalone``: one node, a free port), each running ``wb run`` with the same arguments;
    returns its exit code (non-zero if any rank failed; the launcher stops the others)."""
    from workbench.grpo.distributed import check_distributed, launched_world_size

    if launched_world_size() > 1:
        _fail(f"--nproc {nproc}: this process is already one of {launched_world_size()} launched ranks; drop --nproc")
    if resolved.grpo.backend != "deepspeed":
        _fail(f"--nproc {nproc}: data-parallel ranks train under DeepSpeed; add grpo.backend=deepspeed")
    try:
        check_distributed(resolved.grpo, nproc)
    except ValueError as e:
        _fail(str(e))
    return subprocess.call(launch_command(nproc, args))


def launch_command(nproc: int, args: list[str]) -> list[str]:
    """The launcher's command line: torchrun, and ranks running this workbench's ``wb run ARGS``, neither
    importing from the working directory (:mod:`workbench.isolated`; ``--no-python``: each rank runs the
    command given, ``python -c CODE``, instead of ``python -m``)."""
    from workbench.isolated import python_module

    rank = python_module("workbench.cli", same_workbench=True)
    launcher = python_module("torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "--no-python")
    return [*launcher, *rank, "run", *args]
