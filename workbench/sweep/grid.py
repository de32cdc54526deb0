"""A sweep's grid (pure, no I/O): the points, their baselines and the plan. The argument grammar
(``KEY=LOW..HIGH``, ``KEY=A,B,C``, ``KEY=VALUE``, the aliases) is :mod:`workbench.specs.grid`.

Points are the Cartesian product of the axes. For every combination of the non-drafter axis values
a *baseline* point with ``drafter.kind=none`` is added (and run first), so each point's speedup is
measured against autoregressive generation in the same sweep. Points are deduplicated by their
resolved spec, drafter fields ignored when ``kind=none`` (``k`` means nothing without a drafter).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from workbench.specs import ExperimentSpec, SpecError, apply_overrides, read_raw_spec, validate_spec
from workbench.specs.grid import (  # noqa: F401
    ALIAS_OF,
    ALIASES,
    MAX_POINTS,
    Axis,
    SweepError,
    aliases_text,
    expand_grid,
    parse_axis,
    parse_sweep_args,
    resolve_key,
)

DEFAULT_SWEEP_SPEC = "sweep"
REPEAT_KEY = "seed"  # points that differ only in it are repeats of one setting (pooled into one row)


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


def _overrides(assignment: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in assignment.items()]


def _check(raw: dict[str, Any], assignment: dict[str, str], source: str) -> ExperimentSpec:
    return paired_by_default(validate_spec(apply_overrides(raw, _overrides(assignment)), source=source))


def paired_by_default(spec: ExperimentSpec) -> ExperimentSpec:
    """``measure.paired: null`` means on in sweeps and studies: every speculative point
    times autoregressive generation of the same prompts in the same steps."""
    if spec.measure.paired is None:
        spec.measure.paired = True
    return spec


def _explain(msg: str) -> str:
    return msg + (f"\n  (sweep aliases: {aliases_text()})" if "unknown key" in msg else "")


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
                raise SweepError(
                    _explain(f"override {a.text!r}" + (f" ({a.key})" if a.key != a.name else "") + f": {one}")
                ) from None
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
