"""workbench.runs, the one reader of MLflow runs: nothing else queries runs; the baseline rule; one run
per point; the warm-up rule; paired CIs from a history. Runs are logged by hand into a fresh sqlite store."""

import math
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param

from workbench.runs import RunReader, baseline_for, latest_per_point, same_setting
from workbench.stats import ratio_ci

ROOT = Path(__file__).resolve().parents[1]
# Modules that still query MLflow themselves, each waiting on a change outside this branch; the test
# below fails if one of them stops doing so (shrink the list) or any other module starts.


def log_run(client, exp, name, params=None, metrics=None, status="FINISHED", tags=None, parent=None, start=None):
    """A run logged by hand: ``metrics`` maps key -> values at steps 1, 2, ...; returns the run id."""
    tags = dict(tags or {}) | ({"mlflow.parentRunId": parent} if parent else {})
    run_id = client.create_run(exp, run_name=name, tags=tags, start_time=start).info.run_id
    ms = [Metric(k, float(v), 0, s) for k, vals in (metrics or {}).items() for s, v in enumerate(vals, 1)]
    client.log_batch(run_id, metrics=ms, params=[Param(k, str(v)) for k, v in (params or {}).items()])
    if status != "RUNNING":
        client.set_terminated(run_id, status=status)
    return run_id


def test_only_workbench_runs_queries_mlflow_runs():
    offenders = set()
    for folder in ("workbench", "drafters"):
        for f in (ROOT / folder).rglob("*.py"):
            text = f.read_text()
            if "search_runs" in text or "get_metric_history" in text:
                offenders.add(f.relative_to(ROOT).as_posix())
    assert "workbench/runs.py" in offenders  # the walk found the reader itself
    assert offenders - {"workbench/runs.py"} == set(), "read runs through workbench.runs.RunReader"


SETTING = {
    "model.target": "micro",
    "grpo.group_size": "4",
    "seed": "0",
    "measure.paired": "true",
    "name": "micro",
    "tracking.experiment": "a",
}


def _children(store, specs):
    """A parent with children (name, params overrides, status); returns {name: RunRecord}."""
    exp = store.create_experiment("runs")
    parent = log_run(store, exp, "parent", tags={"workbench.sweep": "s", "workbench.sweep.role": "parent"})
    for name, over, status in specs:
        log_run(store, exp, name, SETTING | over, {"timing_s/gen": [1.0, 1.0]}, status, parent=parent)
    return {r.name: r for r in RunReader().children(parent)}


def test_baseline_for_uses_only_a_finished_baseline_of_the_same_setting(store):
    runs = _children(
        store,
        [
            (
                "base4",
                {"drafter.kind": "none", "measure.paired": "false", "tracking.experiment": "b", "name": "other"},
                "FINISHED",
            ),
            ("base2-failed", {"drafter.kind": "none", "grpo.group_size": "2"}, "FAILED"),
            ("base16", {"drafter.kind": "none", "grpo.group_size": "16"}, "FINISHED"),
            ("k2", {"drafter.kind": "ngram", "drafter.k": "2"}, "FINISHED"),
            ("k2-g2", {"drafter.kind": "ngram", "drafter.k": "2", "grpo.group_size": "2"}, "FINISHED"),
            ("k2-g8", {"drafter.kind": "ngram", "drafter.k": "2", "grpo.group_size": "8"}, "FINISHED"),
        ],
    )
    all_runs = list(runs.values())
    # measure.*, tracking.*, name and drafter.* differences are ignored
    assert same_setting(runs["k2"], runs["base4"])
    assert baseline_for(runs["k2"], all_runs).name == "base4"
    assert baseline_for(runs["k2-g2"], all_runs) is None  # its baseline FAILED: not used
    assert baseline_for(runs["k2-g8"], all_runs) is None  # no group_size=8 baseline: no other setting's instead
    assert baseline_for(runs["base4"], all_runs) is None  # a baseline is not its own baseline


def test_latest_per_point_prefers_the_newest_finished_run(store):
    exp = store.create_experiment("resume")
    parent = log_run(store, exp, "parent")
    for name, point, status, start in [
        ("a-old-ok", "a", "FINISHED", 1),
        ("a-new-failed", "a", "FAILED", 2),
        ("b-failed", "b", "FAILED", 3),
        ("b-killed", "b", "KILLED", 4),
        ("c-ok", "c", "FINISHED", 5),
        ("c-newer-ok", "c", "FINISHED", 6),
        ("untagged-1", None, "FINISHED", 7),
        ("untagged-2", None, "FINISHED", 8),
    ]:
        log_run(
            store,
            exp,
            name,
            tags={"workbench.sweep.point": point} if point else {},
            parent=parent,
            status=status,
            start=start,
        )
    reader = RunReader()
    every = reader.children(parent, one_per_point=False)
    assert len(every) == 8
    assert [r.name for r in latest_per_point(every)] == [
        "a-old-ok",
        "b-killed",
        "c-newer-ok",
        "untagged-1",
        "untagged-2",
    ]
    assert [r.name for r in reader.children(parent)] == [
        "a-old-ok",
        "b-killed",
        "c-newer-ok",
        "untagged-1",
        "untagged-2",
    ]
    # a status filter applies before one run per point is chosen
    assert [r.name for r in reader.children(parent, status="FAILED")] == ["a-new-failed", "b-failed"]


@pytest.mark.parametrize("warmup,expected", [(None, 3.0), ("2", 3.5), ("0", 27.0), ("9", 27.0)])
def test_mean_leaves_out_measure_warmup_steps(store, warmup, expected):
    exp = store.create_experiment("warm")
    params = {"drafter.kind": "none"} | ({"measure.warmup_steps": warmup} if warmup else {})
    rid = log_run(store, exp, "w", params, {"timing_s/gen": [99.0, 2.0, 3.0, 4.0]})
    r = RunReader().get(rid)
    assert r.mean("timing_s/gen") == pytest.approx(expected)  # "9": longer than the run keeps every step
    assert r.series("timing_s/gen", warmup=False) == [99.0, 2.0, 3.0, 4.0]
    assert r.last("timing_s/gen") == 4.0 and r.tail_mean("timing_s/gen", 2) == 3.5
    assert RunReader().get("w").run_id == rid  # by name too


@pytest.mark.parametrize("stored", ["per_step", "before_per_step"])
def test_paired_ci_from_the_per_step_history(store, stored):
    """From ``speedup/gen_per_step`` (the running estimate ``speedup/gen`` beside it is not read), or,
    in a run stored before those keys, from the per-step ``speedup/gen`` itself."""
    exp = store.create_experiment("paired")
    ratios = [1.2, 1.3, 1.25, 1.35]
    metrics = (
        {"speedup/gen_per_step": [9.0, *ratios], "speedup/gen": [9.0, 1.2, 1.25, 1.25, 1.27]}
        if stored == "per_step"
        else {"speedup/gen": [9.0, *ratios]}
    )
    rid = log_run(store, exp, "p", {"drafter.kind": "ngram", "drafter.k": "2"}, metrics)
    unpaired = log_run(store, exp, "u", {"drafter.kind": "ngram", "drafter.k": "2"}, {"timing_s/gen": [1.0, 1.0]})
    reader = RunReader()
    ci = reader.get(rid).paired_ci("speedup/gen")
    want = ratio_ci(ratios)  # the warm-up step's 9.0 is left out
    assert ci.n == 4 and ci.mean == pytest.approx(math.exp(sum(map(math.log, ratios)) / 4))
    assert (ci.low, ci.high) == pytest.approx((want.low, want.high)) and ci.low < ci.mean < ci.high
    assert reader.get(unpaired).paired_ci("speedup/gen") is None
