"""`wb sweep`: a grid of experiments, each compared with autoregressive generation (DESIGN.md §7).

    wb sweep k=1..7                              # experiments/sweep.yaml, k = 1, 2, ..., 7
    wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name my-sweep

Grammar (:mod:`workbench.sweep.grid`, pure, no I/O):

- ``KEY=LOW..HIGH``: an integer axis, inclusive (``k=1..7``).
- ``KEY=A,B,C``: an axis over a comma list; each value parsed like a ``wb run`` override.
- ``KEY=VALUE``: a *fixed* override applied to every point (not an axis).
- ``KEY`` is any dotted spec key or an alias: ``k`` = ``drafter.k``, ``drafter`` = ``drafter.kind``,
  ``init`` = ``drafter.init.data``, ``online`` = ``drafter.online.enabled``.

Points are the Cartesian product of the axes. For every combination of the non-drafter axis values
a *baseline* point with ``drafter.kind=none`` is added (and run first), so each point's speedup is
measured against autoregressive generation in the same sweep. Points are deduplicated by their
resolved spec, drafter fields ignored when ``kind=none`` (``k`` means nothing without a drafter).

MLflow: one parent run per sweep (tag ``workbench.sweep`` = name), one child run per point
(``workbench.axis.<key>`` tags, ``workbench.sweep.point`` = hash of the point's resolved spec),
``speedup/gen`` and ``speedup/step`` logged on each child, ``results.json`` on the parent.
Re-running with the same ``--name`` resumes: children already FINISHED are skipped.
"""

from workbench.sweep.grid import (ALIAS_OF, ALIASES, DEFAULT_SWEEP_SPEC, MAX_POINTS, Axis, Point, SweepError, SweepPlan,
                                  build_points, expand_grid, paired_by_default, parse_axis, parse_sweep_args, plan_sweep)
from workbench.sweep.results import (REPEAT_KEY, Outcome, Row, fill_speedups, group_repeats, plan_table, point_label,
                                     results_json, results_table, speedup, summarize, sweep_rows)
from workbench.sweep.run import SweepResult, default_sweep_name, run_sweep
from workbench.sweep.store import SweepStore

__all__ = ["ALIAS_OF", "ALIASES", "DEFAULT_SWEEP_SPEC", "MAX_POINTS", "Axis", "Outcome", "Point", "REPEAT_KEY", "Row", "SweepError",
           "SweepPlan", "SweepResult", "SweepStore", "build_points", "default_sweep_name", "expand_grid", "fill_speedups",
           "group_repeats", "paired_by_default", "parse_axis", "parse_sweep_args", "plan_sweep", "plan_table", "point_label",
           "results_json", "results_table", "run_sweep", "speedup", "summarize", "sweep_rows"]
