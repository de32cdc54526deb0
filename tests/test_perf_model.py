"""speedup/gen_modeled (workbench.perf.modeled), the cached cost curves (workbench.perf.cost_curve) and
`wb project --calibrate` (workbench.perf.calibrate): hand-computed values, the cache, a micro run."""

import math
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from workbench.perf import calibrate as cal
from workbench.perf import cost_curve as cc
from workbench.perf import modeled as md
from workbench.perf.analytic import CostModel
from workbench.rollout.cost import expected_tokens, knee_verify_ratio

# ------------------------------------------------------------------ the modeled speedup


def test_ar_schedule_hand_count():
    # chunk 2: [1, 3] -> the length-1 row is done after the prefill; the other needs 2 decode forwards
    # of 1 row; [3] -> 2 forwards of 1 row
    assert md.ar_rows_per_forward([1, 3, 3], 2) == [1, 1, 1, 1]
    assert md.ar_rows_per_forward([1, 3, 3], 4) == [2, 2]
    assert md.ar_rows_per_forward([2, 4, 3, 1], 4) == [3, 2, 1]
    assert md.ar_rows_per_forward([1, 1], 8) == []


def test_modeled_speedup_with_a_linear_cost():
    cost = lambda T: 1.0 + 0.05 * T  # noqa: E731  (seconds per forward over T tokens in flight)
    drafter = lambda n, k: 0.2 * n * k / 3  # noqa: E731  (seconds of k draft steps at n rows)
    # AR: lengths [5, 5] in one chunk -> 4 forwards of 2 rows: 4 * 1.1 = 4.4 s
    # spec k=3: 2 forwards of 2 rows -> 2 * (cost(8) + drafter(2)) = 2 * (1.4 + 0.4) = 3.6 s
    m = md.modeled_metrics([5, 5], [2, 2], 3, 2, cost, drafter)
    assert m["gen_autoregressive/modeled_s"] == pytest.approx(4.4)
    assert m["gen/modeled_s"] == pytest.approx(3.6)
    assert m["speedup/gen_modeled"] == pytest.approx(4.4 / 3.6)
    # through the trainer's object, from a rollout output
    ms = md.ModeledSpeedup(CostModel("curve", [1, 100], [1.05, 6.0]), SimpleNamespace(step_at=drafter), k=3, chunk=2)
    out = SimpleNamespace(
        tokens=[[7] * 5, [8] * 5], counters=SimpleNamespace(rows_per_forward=[2, 2], k_per_step=[3, 3])
    )
    assert ms.metrics(out)["speedup/gen_modeled"] == pytest.approx(4.4 / 3.6)
    assert md.modeled_metrics([1], [], 3, 2, cost, drafter)["speedup/gen_modeled"] == 1.0  # nothing decoded
    # adaptive speculation: each forward at its own k_t (0: a plain step, no drafter cost)
    # cost(2*4) + drafter(2, 3) + cost(2*1) = 1.4 + 0.4 + 1.1 = 2.9 s
    assert md.modeled_spec_seconds([2, 2], [3, 0], cost, drafter) == pytest.approx(2.9)


def test_drafter_cost_from_the_draft_curve():
    d = cc.DrafterCost("draft_model", 3, "curve", curve=CostModel("curve", [1, 2, 4], [1.0, 2.0, 4.0]))
    assert d.step(2) == pytest.approx(4.0 + 2 * 2.0)  # one 2-token catch-up forward + k-1 one-token forwards
    assert cc.DrafterCost("ngram", 3, "timed", a=0.5, b=0.25).step(4) == pytest.approx(1.5)
    # at another k_t (adaptive speculation)
    assert d.step_at(2, 1) == pytest.approx(4.0) and d.step_at(2, 0) == 0.0
    assert cc.DrafterCost("ngram", 3, "timed", a=0.5, b=0.25).step_at(4, 1) == pytest.approx(0.5)


# ------------------------------------------------------------------ the cached curve


def test_grid_and_shapes():
    assert cc.token_grid(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert cc.shapes(4, 2) == [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)]


def test_cost_curve_cached_and_keyed_by_model(monkeypatch, tmp_path):
    from tests.conftest import random_llama
    from workbench.rollout.model import LeanLM

    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path))
    calls = []
    real = cc.measure_forward_curve
    monkeypatch.setattr(cc, "measure_forward_curve", lambda *a, **kw: calls.append(a[0]) or real(*a, **kw))
    lm = LeanLM.from_hf(random_llama(hidden=32, layers=1))
    c1, hit1 = cc.forward_curve(lm, 2, 2, 8, "a", progress=False, reps=1)
    c2, hit2 = cc.forward_curve(lm, 2, 2, 8, "a", progress=False, reps=1)
    assert (hit1, hit2) == (False, True) and len(calls) == 1  # the second call read the JSON
    assert c2.tokens == c1.tokens == [1.0, 2.0, 4.0] and c2.seconds == c1.seconds  # shapes (1,1), (2,1), (2,2)
    assert all(a <= b for a, b in zip(c1.seconds, c1.seconds[1:])) and c1.seconds[0] > 0
    assert len(list((tmp_path / "cost_curves").glob("*.json"))) == 1
    other = LeanLM.from_hf(random_llama(hidden=64, layers=1))  # another model config: another key, measured
    _, hit3 = cc.forward_curve(other, 2, 2, 8, "b", progress=False, reps=1)
    assert not hit3 and len(calls) == 2
    assert cc.curve_key(lm, {})[0] != cc.curve_key(other, {})[0]
    assert cc.curve_key(lm, {"ctx": 8})[0] != cc.curve_key(lm, {"ctx": 16})[0]


# ------------------------------------------------------------------ calibration


def test_calibration_hand_values():
    # α = 0.5, k = 3: E[N] = (1 - 0.5^4) / 0.5 = 1.875; S = 1.5 memory-bound -> c = (1.875/1.5 - 1)/3 = 1/12
    assert expected_tokens(0.5, 3) == pytest.approx(1.875)
    r = cal.calibrate(3, 1.5, 0.5, "c", batch=64)
    assert r.c == pytest.approx(1 / 12) and math.isinf(r.knee)
    assert r.predictions[3] == pytest.approx(1.5)  # the measured point is reproduced exactly
    assert r.predictions[1] == pytest.approx(1.5 / (1 / 12 + 1))  # E[N](0.5, 1) = 1.5
    assert r.best_k == max(r.predictions, key=r.predictions.get)
    assert knee_verify_ratio(3, 64, None) == 1.0
    assert knee_verify_ratio(3, 64, 100) == pytest.approx(2.56)  # 256 tokens / 100, the decode step memory-bound
    assert knee_verify_ratio(3, 64, 32) == pytest.approx(4.0)  # both compute-bound: k+1


@pytest.mark.parametrize("c,knee", [(0.1, 100.0), (0.02, 200.0), (0.3, math.inf)])
def test_calibration_round_trips(c, knee):
    alpha, k, B = 0.7, 3, 64
    s = cal.predict_speedup(alpha, k, c, B, knee)
    assert cal.calibrate(k, s, alpha, "c", knee=knee, batch=B).c == pytest.approx(c)
    fitted = cal.calibrate(k, s, alpha, "knee", c=c, batch=B)
    assert fitted.knee == pytest.approx(knee) and fitted.predictions[k] == pytest.approx(s)
    # every k predicted alike from the fitted and the true parameter
    for j in range(1, 8):
        assert fitted.predictions[j] == pytest.approx(cal.predict_speedup(alpha, j, c, B, knee))


def test_calibration_refuses_what_no_parameter_fits():
    with pytest.raises(ValueError, match="c = 0"):
        cal.calibrate(3, 2.0, 0.5, "c")  # above E[N] = 1.875 with a free drafter
    with pytest.raises(ValueError, match="k\\+1"):
        cal.calibrate(3, 0.3, 0.5, "knee", c=0.05)  # would need a verification of > 4 steps
    with pytest.raises(ValueError, match="--c"):
        cal.calibrate(3, 1.2, 0.5, "knee")
    assert cal.fit_knee(1.875 / 4, 3, 1.875, 0.0, 64) == 64  # fully compute-bound: any knee <= B, reported as B
    with pytest.raises(ValueError, match="exactly one"):
        cal.alpha_from_inputs(3, 2.0, [0.5], None)


def test_cli_calibrate():
    from workbench.cli import app

    r = CliRunner().invoke(
        app,
        ["project", "--calibrate", "--k", "3", "--acceptance-length", "1.875", "--gen-speedup", "1.5"],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    assert "c = 0.08333" in r.output and "reproduced: 1.500" in r.output and "best k" in r.output
    r = CliRunner().invoke(
        app,
        [
            "project",
            "--calibrate",
            "--k",
            "3",
            "--per-pos",
            "0.5,0.25,0.125",
            "--gen-speedup",
            "1.5",
            "--unknown",
            "knee",
            "--c",
            "0.05",
            "--batch",
            "64",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    assert "T_knee" in r.output and "α = 0.5000" in r.output
    bad = CliRunner().invoke(
        app, ["project", "--calibrate", "--k", "3", "--acceptance-length", "1.875", "--gen-speedup", "2.5"]
    )
    assert bad.exit_code == 2 and "c = 0" in bad.output
    assert (
        CliRunner()
        .invoke(app, ["project", "--calibrate", "--acceptance-length", "2", "--gen-speedup", "1.2"])
        .exit_code
        == 2
    )


# ------------------------------------------------------------------ in a run


def test_summary_table_shows_the_modeled_mean():
    from rich.console import Console

    from workbench.experiment import RunResult, summary_table
    from workbench.specs import load_spec

    res = RunResult(
        None,
        "",
        [
            {"reward/mean": 0.0, "speedup/gen_modeled": 9.0},
            {"reward/mean": 0.0, "speedup/gen_modeled": 1.25},
            {"reward/mean": 0.0, "speedup/gen_modeled": 1.75},
        ],
    )
    con = Console(width=200, record=True)
    con.print(summary_table(load_spec("micro"), res))
    text = con.export_text()
    assert "speedup/gen_modeled (mean)" in text and "1.50×" in text  # step 1 left out as warm-up


@pytest.mark.parametrize(
    "kind,extra,logged",
    [
        ("draft_model", [], True),
        ("ngram", [], True),
        ("none", [], False),
        ("draft_model", ["measure.modeled=false"], False),
    ],
)
def test_micro_run_logs_gen_modeled(store, monkeypatch, kind, extra, logged):
    from workbench import experiment as experiment_mod  # run_experiment attaches the modeled instrument
    from workbench.cli import app
    from workbench.tracking import Tracker

    events = []
    real_enter, real_build = Tracker.__enter__, experiment_mod.build_modeled
    monkeypatch.setattr(Tracker, "__enter__", lambda self: events.append("run opens") or real_enter(self))
    monkeypatch.setattr(
        experiment_mod, "build_modeled", lambda *a, **kw: events.append("costs") or real_build(*a, **kw)
    )
    res = CliRunner().invoke(
        app, ["run", "micro", f"drafter.kind={kind}", "grpo.steps=2", "grpo.eval_every=0", *extra, "--quiet"]
    )
    assert res.exit_code == 0, res.output
    exp = store.get_experiment_by_name("workbench-micro")
    [run] = store.search_runs([exp.experiment_id])
    for key in ("speedup/gen_modeled", "gen/modeled_s", "gen_autoregressive/modeled_s"):
        assert (key in run.data.metrics) == logged, key
    if logged:
        assert [m.step for m in store.get_metric_history(run.info.run_id, "speedup/gen_modeled")] == [1, 2]
        assert run.data.metrics["speedup/gen_modeled"] > 0 and run.data.metrics["gen/modeled_s"] > 0
    assert events == ["costs", "run opens"]  # cost curves are loaded or measured before the MLflow run opens
