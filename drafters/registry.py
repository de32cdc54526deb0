"""The registry of drafter kinds by name (vLLM's ``speculative_config.method`` vocabulary)."""

from __future__ import annotations

from typing import Any

import torch

from workbench.rollout.drafter import Drafter, DrafterTarget

DRAFTERS: dict[str, type[Drafter]] = {}


def register(cls: type[Drafter]) -> type[Drafter]:
    """Class decorator: make a drafter kind available by its ``kind`` name."""
    DRAFTERS[cls.kind] = cls
    return cls


def drafter_class(kind: str) -> type[Drafter] | None:
    """The class registered for ``kind`` (its capabilities: ``trainable``, ``arch_fields``, ``vllm_weights``);
    None for ``none`` (plain decoding).

    Raises:
        ValueError: unknown kind, listing the registered ones.
    """
    if kind == "none":
        return None
    if kind not in DRAFTERS:
        raise ValueError(f"drafter.kind: unknown drafter {kind!r}; allowed values: none, {', '.join(DRAFTERS)}")
    return DRAFTERS[kind]


def draft_cost_of(kind: str) -> str | None:
    """How the performance models cost ``kind``'s drafting (its class's ``draft_cost``: "host", "model",
    "head"); None for ``none`` (plain decoding).

    Raises:
        ValueError: unknown kind, listing the registered ones.
    """
    cls = drafter_class(kind)
    return None if cls is None else cls.draft_cost


def build_drafter(kind: str, spec: Any, target: DrafterTarget, device: torch.device) -> Drafter | None:
    """Drafter instance for ``spec`` (a ``DrafterSpec``) drafting for ``target``; None for kind ``none``.

    Raises:
        ValueError: unknown kind, listing the registered ones.
        TypeError: ``target`` is not a :class:`DrafterTarget`.
    """
    cls = drafter_class(kind)
    if cls is None:
        return None
    if not isinstance(target, DrafterTarget):
        raise TypeError(f"build_drafter: target must be a DrafterTarget, got {type(target).__name__}")
    drafter = cls.from_spec(spec, target=target, device=device)
    drafter.distill_temperature = float(getattr(spec, "distill_temperature", 1.0))
    return drafter
