"""Command lines for the Python subprocesses the workbench starts (``wb ui``'s MLflow server, ``wb run --nproc``'s
launcher and ranks) that never import a module from the working directory.

``python -m MODULE`` and ``python -c CODE`` put the working directory first on ``sys.path``: started from a
folder holding an ``mlflow/`` or ``workbench/`` package, the subprocess would run that folder's code instead
of the installed one. :func:`python_module` runs ``MODULE`` as ``-m`` does (``runpy``, as ``__main__``) with
that first entry taken off, or replaced by the folder this ``workbench`` was imported from (``same_workbench``:
a rank runs the code its launcher runs, a checkout's or the installed one). The same on every Python
(``-P`` needs 3.11; the project supports 3.10).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the folder holding the running workbench package (a checkout's root or site-packages)
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def module_code(module: str, same_workbench: bool = False) -> str:
    """The ``-c`` program that runs ``module`` as ``python -m module`` would, without the working directory."""
    return (
        "import runpy, sys\n"
        "if sys.path[:1] == ['']: del sys.path[0]\n"
        + (f"sys.path.insert(0, {PACKAGE_ROOT!r})\n" if same_workbench else "")
        + f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


def python_module(module: str, *args: str, same_workbench: bool = False, executable: str = sys.executable) -> list[str]:
    """``[python, -c, CODE, *args]``: ``python -m module args`` without a module from the working directory."""
    return [executable, "-c", module_code(module, same_workbench), *args]
