"""`wb` as a separate process, for the tests of several workers, clusters and servers (test_ray, test_postgres)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_wb(tmp: Path, args: list[str], log: str, env: dict[str, str]) -> subprocess.Popen:
    """``python -m workbench.cli ARGS`` in ``tmp`` with ``env`` over this one, this checkout first on the path,
    one torch thread (2-core CI), output to ``tmp / log``."""
    full = {
        **os.environ,
        **env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(tmp / log, "w") as out:  # the child keeps its own copy of the file
        return subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", *args], cwd=tmp, env=full, stdout=out, stderr=subprocess.STDOUT
        )


def finish(proc: subprocess.Popen, tmp: Path, log: str, timeout: float = 300, ok: bool = True) -> str:
    """Wait for ``proc`` (killed past ``timeout`` s) and return its output; with ``ok``, assert it exited 0."""
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp / log).read_text()
    assert not ok or proc.returncode == 0, text[-4000:]
    return text
