"""`wb ui`: the MLflow UI on the workbench's store, and the last sweep's compare view."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from workbench.cli.common import _fail, app, console, err


@app.command(context_settings={"allow_extra_args": False})
def ui(
    backend_store_uri: Optional[str] = typer.Option(
        None, "--backend-store-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Interface to listen on (loopback by default; another, e.g. 0.0.0.0, opens the UI to the network: "
        "a warning says so and the links name this machine).",
    ),
    port: int = typer.Option(5000, "--port", "-p", min=1, max=65535, help="Port."),
    sweep: Optional[str] = typer.Option(
        None, "--sweep", help="Sweep/study (or parent run) whose child runs to compare (default: the newest)."
    ),
    print_url: bool = typer.Option(
        False, "--print-url", "--no-server", help="Print the URLs and exit; start no server."
    ),
    open_browser: bool = typer.Option(
        False, "--open", help="Open the comparison view in a web browser once the server is up."
    ),
) -> None:
    """Start the MLflow UI on the workbench's store and print the comparison view of the last sweep
    and its k vs speedup plot (speedup_vs_k.png on the sweep's parent run)."""
    import shutil
    import subprocess

    from workbench.runs import UnsearchableName
    from workbench.sweep.plot import PLOT_NAME
    from workbench.ui import (
        artifact_url,
        base_url,
        compare_url,
        default_store,
        experiment_url,
        find_group,
        has_artifact,
        is_local,
        network_url,
        start_server,
        wait_ready,
    )

    store = default_store(backend_store_uri)
    local = base_url(host, port)  # where this machine reaches the server
    base = local if is_local(host) else network_url(host, port)  # the links printed
    if not is_local(host):
        err.print(
            escape(
                f"warning: --host {host} listens beyond this machine: anyone who reaches {base} can read and "
                "change the runs (MLflow's server has no login); --host 127.0.0.1 keeps it local"
            ),
            highlight=False,
        )
    url = None
    try:
        group = find_group(store, sweep)
    except UnsearchableName as e:
        _fail(f"--sweep: {e}")
    except Exception as e:  # noqa: BLE001 - unreadable store
        if print_url:
            _fail(f"cannot read the MLflow store {store}: {e}")
        group = None
    if group is None:
        if sweep:
            _fail(f"no sweep, study or parent run {sweep!r} in {store}")
        console.print(escape(f"no sweep in {store} yet; runs at {base}"), highlight=False)
    else:
        parent, kids = group
        label = parent.tags.get("workbench.sweep") or parent.tags.get("workbench.study") or parent.name
        if kids:
            url = compare_url(base, [k.run_id for k in kids], [k.experiment_id for k in kids])
            console.print(f"compare the {len(kids)} runs of [bold]{escape(label)}[/]:", highlight=False)
            console.print(url, highlight=False, soft_wrap=True, markup=False)
            console.print(
                "(MLflow's compare view cannot be linked to a chosen plot: pick drafter.k and speedup/gen as its X "
                "and Y)",
                highlight=False,
            )
        if has_artifact(store, parent.run_id, PLOT_NAME):
            console.print(
                f"k vs speedup: {artifact_url(base, parent.experiment_id, parent.run_id, PLOT_NAME)}",
                highlight=False,
                soft_wrap=True,
            )
        console.print(f"experiment: {experiment_url(base, parent.experiment_id)}", highlight=False, soft_wrap=True)
    if print_url:
        return
    where = base if base == local else f"{base} (listening on {host or '0.0.0.0'}:{port}; here {local})"
    console.print(escape(f"starting MLflow UI on {store} at {where} (Ctrl-C stops it)"), highlight=False)
    import signal

    def _term(*_):  # `kill` of wb stops the server too
        raise KeyboardInterrupt

    proc, here = start_server(store, host, port)
    old = signal.signal(signal.SIGTERM, _term)
    code = 130
    try:
        if open_browser and wait_ready(local, 60, proc):
            import webbrowser

            webbrowser.open((url or base).replace(base, local, 1))
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
        shutil.rmtree(here, ignore_errors=True)
    raise typer.Exit(code)
