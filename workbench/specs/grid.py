"""The grid grammar of sweeps (pure, no I/O): one ``KEY=VALUES`` argument an axis, their Cartesian product.

Shared by ``wb sweep`` (:mod:`workbench.sweep.grid`: experiment points and their baselines) and
``wb simulate`` (:mod:`workbench.perf.simulate.run`: scenario grids). One argument each:

- ``KEY=LOW..HIGH``: an integer axis, inclusive (``k=1..7``).
- ``KEY=A,B,C``: an axis over a comma list; each value parsed like a ``wb run`` override.
- ``KEY=VALUE``: a *fixed* override applied to every point (not an axis).
- ``KEY`` is any dotted spec key or an alias: ``k`` = ``drafter.k``, ``drafter`` = ``drafter.kind``,
  ``init`` = ``drafter.init.data``, ``online`` = ``drafter.online.enabled``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from workbench.specs.sections import SpecError

ALIASES = {"k": "drafter.k", "drafter": "drafter.kind", "init": "drafter.init.data", "online": "drafter.online.enabled"}
ALIAS_OF = {v: k for k, v in ALIASES.items()}
MAX_POINTS = 1000

_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


class SweepError(SpecError):
    """A sweep that cannot be planned: bad axis grammar or a point whose spec is invalid."""


@dataclass(frozen=True)
class Axis:
    """One ``KEY=VALUES`` argument. ``values`` are raw strings, applied like ``wb run`` overrides."""

    name: str  # as typed (``k``)
    key: str  # dotted spec key (``drafter.k``)
    values: tuple[str, ...]
    fixed: bool = False  # a plain KEY=VALUE: one value for every point, not an axis

    @property
    def text(self) -> str:
        return f"{self.name}={','.join(self.values)}"


def resolve_key(name: str) -> str:
    """Alias (``k``, ``drafter``, ``init``) -> dotted spec key; any other name is returned as is."""
    return ALIASES.get(name, name)


def parse_axis(item: str) -> Axis:
    """Parse one sweep argument: ``k=1..7``, ``drafter=ngram,draft_model`` or ``grpo.steps=3``.

    Ranges are integers, inclusive, LOW <= HIGH. A value starting with ``[`` or ``{`` is one YAML
    value (not split on commas). Does not check the key against the spec (see :func:`build_points`).

    Raises:
        SweepError: no ``=``, empty key, no values, an empty list item, or a malformed/empty range;
            the message names the argument and shows the fix.
    """
    if "=" not in item:
        raise SweepError(
            f"sweep argument {item!r} must look like KEY=VALUES, e.g. k=1..7 or drafter=ngram,draft_model "
            "(the spec, if given, comes first)"
        )
    name, raw = (s.strip() for s in item.split("=", 1))
    if not name or any(not p for p in name.split(".")):
        raise SweepError(
            f"sweep argument {item!r}: empty key; use a dotted spec key such as drafter.k or an alias "
            f"({aliases_text()})"
        )
    key = resolve_key(name)
    if not raw:
        raise SweepError(
            f"axis {name!r}: no values; give {name}=LOW..HIGH (e.g. {name}=1..7), {name}=A,B or {name}=VALUE"
        )
    if ".." in raw and not raw.startswith(("[", "{")):
        m = _RANGE.match(raw)
        if not m:
            raise SweepError(
                f"axis {name!r}: bad range {raw!r}; a range is LOW..HIGH with integer ends, inclusive, e.g. "
                f"{name}=1..7 (list other values with commas: a,b,c)"
            )
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise SweepError(
                f"axis {name!r}: empty range {raw!r} (LOW {lo} > HIGH {hi}); write it as {name}={hi}..{lo}"
            )
        return Axis(name, key, tuple(str(v) for v in range(lo, hi + 1)))
    if raw.startswith(("[", "{")) or "," not in raw:
        return Axis(name, key, (raw,), fixed=True)
    values = [v.strip() for v in raw.split(",")]
    if any(not v for v in values):
        raise SweepError(f"axis {name!r}: empty value in list {raw!r}; remove the stray comma, e.g. {name}=a,b")
    return Axis(name, key, tuple(dict.fromkeys(values)))  # repeated values once, order kept


def parse_sweep_args(items: list[str]) -> tuple[list[Axis], list[Axis]]:
    """Split sweep arguments into (axes, fixed overrides).

    Raises:
        SweepError: a bad argument (see :func:`parse_axis`) or the same spec key given twice.
    """
    parsed = [parse_axis(i) for i in items]
    seen: dict[str, Axis] = {}
    for a in parsed:
        if a.key in seen:
            raise SweepError(f"{a.key!r} is given twice ({seen[a.key].text} and {a.text}); give it once")
        if not a.fixed and a.key.split(".")[0] == "tracking":
            raise SweepError(
                f"axis {a.name!r}: tracking.* says where runs are logged, it cannot be an axis; give one value"
            )
        seen[a.key] = a
    return [a for a in parsed if not a.fixed], [a for a in parsed if a.fixed]


def expand_grid(axes: list[Axis]) -> list[dict[str, str]]:
    """Cartesian product of the axes: one ``{key: raw value}`` per point, first axis slowest.

    No axes -> one empty point (the base spec). Raises SweepError above MAX_POINTS points.
    """
    n = 1
    for a in axes:
        n *= len(a.values)
    if n > MAX_POINTS:
        raise SweepError(f"the grid has {n} points (limit {MAX_POINTS}); use fewer axis values")
    return [dict(zip([a.key for a in axes], combo)) for combo in itertools.product(*(a.values for a in axes))]


def aliases_text() -> str:
    """The aliases as ``k = drafter.k, ...`` (for messages)."""
    return ", ".join(f"{a} = {k}" for a, k in ALIASES.items())
