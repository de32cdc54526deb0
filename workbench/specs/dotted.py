"""Dotted keys over nested spec mappings (``drafter.k``): flatten, and the one setter that overrides,
tune trials and the performance model use."""

from __future__ import annotations

import copy
from typing import Any


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``raw`` with ``value`` at dotted ``key`` (``drafter.k``); missing sections are created.

    Raises:
        ValueError: a part of ``key`` is empty, or names a value rather than a section
            (``drafter.k.x``); the message names the key.
    """
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ValueError(f"{key!r}: empty key; use a dotted key such as drafter.k")
    data = copy.deepcopy(raw)
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{key!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value
    return data
