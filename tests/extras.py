"""Tests that need an optional extra skip, naming the install line, when it is missing, so the README's test
command passes with only ``pip install -e ".[test]"``. Each carries the ``extra`` marker too: `.ci/run` runs
``pytest -m extra`` before it installs the extras, which shows every one of them skips cleanly there."""

from importlib.util import find_spec

import pytest


def marks(extra: str, *modules: str, install: str | None = None) -> list[pytest.MarkDecorator]:
    """``[extra marker, skip unless every module is importable]`` for a module's ``pytestmark``.

    install: the install line to name (default ``pip install -e ".[EXTRA]"``).
    """
    missing = [m for m in modules if find_spec(m) is None]
    line = install or f'pip install -e ".[{extra}]"'
    return [pytest.mark.extra(extra), pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}: {line}")]


def requires(extra: str, *modules: str, install: str | None = None):
    """A test decorator: :func:`marks` applied to one test."""

    def apply(test):
        for mark in marks(extra, *modules, install=install):
            test = mark(test)
        return test

    return apply


math_verify = requires("real", "math_verify")
