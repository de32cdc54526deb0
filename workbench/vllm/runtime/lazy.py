"""The ``__getattr__`` of :mod:`workbench.vllm`'s entry modules: a name is imported from its module on
first use (PEP 562), so importing an entry (the ``wb`` script's preload runs before torch) imports
nothing heavy."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_getattr(entry: str, table: dict[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``entry`` that loads ``table``'s names ({module: (name, ...)}).

    Not cached: a test that patches the defining module's attribute reaches every later lookup.
    Raises AttributeError for a name not in ``table``, as a module does.
    """
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {entry!r} has no attribute {name!r}")

    return __getattr__
