"""`wb sweep`: a grid of experiments, each compared with autoregressive generation (docs/design.md §7).

    wb sweep k=1..7                              # experiments/sweep.yaml, k = 1, 2, ..., 7
    wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name my-sweep

The argument grammar (``KEY=LOW..HIGH``, ``KEY=A,B,C``, ``KEY=VALUE``, aliases ``k``, ``drafter``, ``init``,
``online``), the points and their ``drafter.kind=none`` baselines: :mod:`workbench.sweep.grid` (pure, no I/O).

MLflow: one parent run per sweep (tag ``workbench.sweep`` = name), one child run per point
(``workbench.axis.<key>`` tags, ``workbench.sweep.point`` = hash of the point's resolved spec),
``speedup/gen`` and ``speedup/step`` (the point's running estimate; per-step ratios ``..._per_step``)
logged on each child, ``results.json`` and ``speedup_vs_k.png`` on the parent.
Re-running with the same ``--name`` resumes: children already FINISHED are skipped. Several processes
with the same ``--name`` share the sweep, each point claimed by one of them: :mod:`workbench.sweep.claims`.
"""

import sys
import types

from workbench.sweep.grid import (
    ALIAS_OF,
    ALIASES,
    DEFAULT_SWEEP_SPEC,
    MAX_POINTS,
    Axis,
    Point,
    SweepError,
    SweepPlan,
    build_points,
    expand_grid,
    paired_by_default,
    parse_axis,
    parse_sweep_args,
    plan_sweep,
)
from workbench.sweep.results import (
    REPEAT_KEY,
    Outcome,
    Row,
    fill_speedups,
    group_repeats,
    plan_table,
    point_label,
    results_json,
    results_table,
    speedup,
    summarize,
    sweep_rows,
)
from workbench.sweep.run import SweepResult, default_sweep_name, run_sweep, sweep
from workbench.sweep.store import SweepStore

__all__ = [
    "ALIAS_OF",
    "ALIASES",
    "DEFAULT_SWEEP_SPEC",
    "MAX_POINTS",
    "Axis",
    "Outcome",
    "Point",
    "REPEAT_KEY",
    "Row",
    "SweepError",
    "SweepPlan",
    "SweepResult",
    "SweepStore",
    "build_points",
    "default_sweep_name",
    "expand_grid",
    "fill_speedups",
    "group_repeats",
    "paired_by_default",
    "parse_axis",
    "parse_sweep_args",
    "plan_sweep",
    "plan_table",
    "point_label",
    "results_json",
    "results_table",
    "run_sweep",
    "speedup",
    "summarize",
    "sweep",
    "sweep_rows",
]


class _SweepPackage(types.ModuleType):
    """This package is callable as :func:`workbench.sweep.run.sweep` (``from workbench import sweep``)."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _SweepPackage
