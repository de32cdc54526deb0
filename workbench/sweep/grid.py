"""A sweep's grid (pure, no I/O): the argument grammar, the points, their baselines and the plan.

Grammar (one argument each):

- ``KEY=LOW..HIGH``: an integer axis, inclusive (``k=1..7``).
- ``KEY=A,B,C``: an axis over a comma list; each value parsed like a ``wb run`` override.
- ``KEY=VALUE``: a *fixed* override applied to every point (not an axis).
- ``KEY`` is any dotted spec key or an alias: ``k`` = ``drafter.k``, ``drafter`` = ``drafter.kind``,
  ``init`` = ``drafter.init.data``, ``online`` = ``drafter.online.enabled``.

Points are the Cartesian product of the axes. For every combination of the non-drafter axis values
a *baseline* point with ``drafter.kind=none`` is added (and run first), so each point's speedup is
measured against autoregressive generation in the same sweep. Points are deduplicated by their
resolved spec, drafter fields ignored when ``kind=none`` (``k`` means nothing without a drafter).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from workbench.specs import ExperimentSpec, SpecError, apply_overrides, read_raw_spec, validate_spec

DEFAULT_SWEEP_SPEC = "sweep"
ALIASES = {"k": "drafter.k", "drafter": "drafter.kind", "init": "drafter.init.data", "online": "drafter.online.enabled"}
ALIAS_OF = {v: k for k, v in ALIASES.items()}
MAX_POINTS = 1000
REPEAT_KEY = "seed"  # points that differ only in it are repeats of one setting (pooled into one row)


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
        raise SweepError(f"sweep argument {item!r}: empty key; use a dotted spec key such as drafter.k or an alias ({_aliases()})")
    key = resolve_key(name)
    if not raw:
        raise SweepError(f"axis {name!r}: no values; give {name}=LOW..HIGH (e.g. {name}=1..7), {name}=A,B or {name}=VALUE")
    if ".." in raw and not raw.startswith(("[", "{")):
        m = _RANGE.match(raw)
        if not m:
            raise SweepError(
                f"axis {name!r}: bad range {raw!r}; a range is LOW..HIGH with integer ends, inclusive, e.g. {name}=1..7 "
                "(list other values with commas: a,b,c)"
            )
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise SweepError(f"axis {name!r}: empty range {raw!r} (LOW {lo} > HIGH {hi}); write it as {name}={hi}..{lo}")
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
            raise SweepError(f"axis {a.name!r}: tracking.* says where runs are logged, it cannot be an axis; give one value")
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


def is_drafter_key(key: str) -> bool:
    return key.split(".")[0] == "drafter"


def baseline_of(assignment: dict[str, str]) -> dict[str, str]:
    """The autoregressive baseline of a point: its non-drafter values with ``drafter.kind=none``."""
    return {**{k: v for k, v in assignment.items() if not is_drafter_key(k)}, "drafter.kind": "none"}


def with_baselines(grid: list[dict[str, str]]) -> list[dict[str, str]]:
    """Baselines first (one per distinct combination of non-drafter values), then the grid."""
    baselines = {json.dumps(baseline_of(a)): baseline_of(a) for a in grid}
    return [*baselines.values(), *grid]


def point_key(spec: ExperimentSpec) -> str:
    """12-hex hash of what a point measures: the resolved spec without ``tracking`` (where it is
    logged), and with only ``drafter.kind`` when the kind is ``none`` (other drafter fields are unused)."""
    d = spec.model_dump(mode="json")
    d.pop("tracking", None)
    if spec.drafter.kind == "none":
        d["drafter"] = {"kind": "none"}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Point:
    """One experiment of the sweep. ``assignment``: axis key -> raw value (baselines: kind=none)."""

    assignment: dict[str, str]
    spec: ExperimentSpec
    key: str  # point_key(spec)
    baseline_key: str  # point_key of its baseline (== key for a baseline)

    @property
    def is_baseline(self) -> bool:
        return self.spec.drafter.kind == "none"

    def label(self, axes: list[Axis]) -> str:
        """``k=3 drafter=ngram`` (alias names as typed); ``baseline`` parts for kind=none."""
        parts = [f"{a.name}={self.display(a)}" for a in axes if self.display(a) != "-"]
        if self.is_baseline:
            parts = ["baseline (drafter=none)", *[p for p in parts if not p.startswith(("drafter=", "drafter.kind="))]]
        return " ".join(parts) or "base spec"

    def display(self, axis: Axis) -> str:
        """The value shown for an axis: ``-`` for drafter fields of a kind=none point."""
        if self.is_baseline and is_drafter_key(axis.key):
            return "none" if axis.key == "drafter.kind" else "-"
        return self.assignment.get(axis.key, "-")


def dedupe(points: list[Point]) -> list[Point]:
    """Keep the first point of each resolved spec (``Point.key``); order is kept."""
    seen: dict[str, Point] = {}
    for p in points:
        seen.setdefault(p.key, p)
    return list(seen.values())


def _aliases() -> str:
    return ", ".join(f"{a} = {k}" for a, k in ALIASES.items())


def _overrides(assignment: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in assignment.items()]


def _check(raw: dict[str, Any], assignment: dict[str, str], source: str) -> ExperimentSpec:
    return paired_by_default(validate_spec(apply_overrides(raw, _overrides(assignment)), source=source))


def paired_by_default(spec: ExperimentSpec) -> ExperimentSpec:
    """``measure.paired: null`` means on in sweeps and studies (issue #6): every speculative point
    times autoregressive generation of the same prompts in the same steps."""
    if spec.measure.paired is None:
        spec.measure.paired = True
    return spec


def _explain(msg: str) -> str:
    return msg + (f"\n  (sweep aliases: {_aliases()})" if "unknown key" in msg else "")


def build_points(raw: dict[str, Any], axes: list[Axis], fixed: list[Axis]) -> tuple[ExperimentSpec, list[Point]]:
    """Resolve and validate every point: (base spec with the fixed overrides, deduplicated points).

    ``raw`` is the loaded spec YAML (a dict). Baselines come first (see :func:`with_baselines`).

    Raises:
        SweepError: a fixed override or an axis value makes an invalid spec (the message names the
            argument and carries the spec error with the allowed keys/values), or a combination of
            valid values is invalid (the message names the point).
    """
    fixed_assign = {a.key: a.values[0] for a in fixed}
    try:
        base_raw = apply_overrides(raw, _overrides(fixed_assign))
        base = validate_spec(base_raw, source="sweep spec")
    except SpecError as e:
        for a in fixed:  # name the culprit when one override alone is bad
            try:
                _check(raw, {a.key: a.values[0]}, "spec")
            except SpecError as one:
                raise SweepError(_explain(f"override {a.text!r}" + (f" ({a.key})" if a.key != a.name else "") + f": {one}")) from None
        raise SweepError(_explain(f"fixed overrides {' '.join(a.text for a in fixed)}: {e}")) from None

    by_key = {a.key: a for a in axes}
    points: list[Point] = []
    for assignment in with_baselines(expand_grid(axes)):
        try:
            spec = _check(base_raw, assignment, "point")
        except SpecError as e:
            for k, v in assignment.items():
                try:
                    _check(base_raw, {k: v}, "spec")
                except SpecError as one:
                    a = by_key.get(k)
                    name = f"axis {a.name!r}" + (f" ({k})" if k != a.name else "") if a else f"baseline {k}"
                    raise SweepError(_explain(f"{name}, value {v!r}: {one}")) from None
            raise SweepError(_explain(f"point {' '.join(_overrides(assignment))}: {e}")) from None
        base_assign = baseline_of(assignment)
        bkey = point_key(spec) if spec.drafter.kind == "none" else point_key(_check(base_raw, base_assign, "baseline"))
        points.append(Point(assignment, spec, point_key(spec), bkey))
    return base, dedupe(points)


@dataclass
class SweepPlan:
    """What `wb sweep` will run: the spec source, axes, fixed overrides and validated points."""

    spec_path: str
    base: ExperimentSpec
    axes: list[Axis]
    fixed: list[Axis]
    points: list[Point]


def plan_sweep(spec: str | None, items: list[str], repeats: int = 1) -> SweepPlan:
    """Load the spec (default ``experiments/sweep.yaml``), parse the arguments, validate every point.

    ``repeats`` > 1 adds the axis ``seed`` = spec seed .. seed + repeats - 1 (the table pools repeats).

    Raises:
        SweepError / SpecError: anything wrong, before anything runs.
    """
    path, raw = read_raw_spec(spec or DEFAULT_SWEEP_SPEC)
    axes, fixed = parse_sweep_args(items)
    if repeats < 1:
        raise SweepError(f"--repeats {repeats}: give 1 or more")
    if repeats > 1:
        if any(a.key == REPEAT_KEY for a in (*axes, *fixed)):
            raise SweepError("--repeats and a seed= argument both set the seeds; give one of them")
        seed = int(raw.get("seed", 0) or 0)
        axes.append(Axis(REPEAT_KEY, REPEAT_KEY, tuple(str(seed + i) for i in range(repeats))))
    base, points = build_points(raw, axes, fixed)
    return SweepPlan(str(path), base, axes, fixed, points)
