"""Drafters: anything that proposes draft tokens for speculative rollouts, registered by name.

A drafter kind is a module in this package that implements the engine's drafter interface
(:class:`workbench.rollout.drafter.Drafter`) and registers it with :func:`register`. ``DRAFTERS``
maps the kind (vLLM's ``method`` vocabulary: ``ngram``, ``suffix``, ``draft_model``, ``mtp``, ``eagle3``) to
its class.
"""

from drafters.registry import DRAFTERS, build_drafter, draft_cost_of, drafter_class, register
from workbench.rollout.drafter import DraftContext, Drafter, DrafterTarget, DraftProposal

# Import for registration side effects (one module per drafter kind), in this order: DRAFTERS lists the kinds
# in the order they registered (error messages, `wb audit`'s default), so the import sorter leaves it alone.
# isort: off
from drafters import ngram as _ngram  # noqa: F401,E402
from drafters import suffix as _suffix  # noqa: F401,E402
from drafters import draft_model as _draft_model  # noqa: F401,E402
from drafters import mtp as _mtp  # noqa: F401,E402
from drafters import eagle3 as _eagle3  # noqa: F401,E402
from drafters import dflash as _dflash  # noqa: F401,E402
# isort: on

__all__ = [
    "DRAFTERS",
    "Drafter",
    "DraftContext",
    "DraftProposal",
    "DrafterTarget",
    "build_drafter",
    "draft_cost_of",
    "drafter_class",
    "register",
]
