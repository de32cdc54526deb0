"""The ``wb`` program (``[project.scripts]``): vLLM-CPU's library preload first, then the Typer app.

The preload (:mod:`workbench.rollout.vllm.preload`) re-executes the process, which is only cheap before
torch and the commands are imported; so this entry imports nothing else until it has decided.
"""


def main() -> None:  # pragma: no cover (exercised through the installed `wb` in tests/test_preload.py)
    from workbench.rollout.vllm.preload import reexec_if_needed

    reexec_if_needed()
    import signal

    # SIGTERM (`kill`, `timeout`, a scheduler's preemption) ends a command as Ctrl-C does, so an open
    # MLflow run is marked KILLED with what it logged kept, instead of being left RUNNING forever.
    signal.signal(signal.SIGTERM, _interrupt)
    from workbench.cli import app

    app()


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")
