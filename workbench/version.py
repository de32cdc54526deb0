"""The workbench's version and, run from a git checkout, its commit: ``wb --version`` and every run's tags.

The version is the installed distribution's (``importlib.metadata``, from pyproject.toml); the commit is
read with ``git`` from the folder holding this package, only when that folder is a checkout (a wheel
install has none, and then none is claimed).
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "speculation-workbench"
_ROOT = Path(__file__).resolve().parents[1]  # the checkout's root when run from source


def version() -> str:
    """The installed version (pyproject.toml's ``version``), or ``"unknown"`` when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


@lru_cache(maxsize=1)
def git_commit() -> tuple[str, bool] | None:
    """(the checkout's HEAD commit, 40 hex digits; whether tracked files differ from it), or None outside a
    git checkout or without git."""
    if not (_ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head, bool(dirty)) if head else None


def version_line() -> str:
    """``speculation-workbench 0.1.0 (commit abc123...)``: what ``wb --version`` prints."""
    commit = git_commit()
    if commit is None:
        return f"{DISTRIBUTION} {version()}"
    return f"{DISTRIBUTION} {version()} (commit {commit[0]}{', with uncommitted changes' if commit[1] else ''})"
