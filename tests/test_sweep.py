"""`wb sweep`: grammar, planning (baselines, dedup, validation), MLflow parent/child runs, resume."""

import json
import math

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from workbench.cli import app
from workbench.stats import ratio_ci
from workbench.sweep import SweepError, expand_grid, parse_axis, parse_sweep_args, plan_sweep, speedup, summarize
from workbench.tracking import Tracker

runner = CliRunner()


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """cwd = tmp_path, MLflow store = tmp_path/mlflow.db (not created until something logs)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


@pytest.fixture()
def store(workdir):
    return MlflowClient(f"sqlite:///{workdir}/mlflow.db")


def _sweep_runs(client, name, experiment="workbench-micro"):
    """(parent run, child runs) of the sweep ``name``."""
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.sweep` = '{name}'")
    parents = [r for r in runs if r.data.tags["workbench.sweep.role"] == "parent"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], children


# ----------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(
    "item,key,values,fixed",
    [
        ("k=1..4", "drafter.k", ("1", "2", "3", "4"), False),
        ("k=3..3", "drafter.k", ("3",), False),
        ("drafter=ngram,draft_model", "drafter.kind", ("ngram", "draft_model"), False),
        ("drafter.kind=ngram, draft_model,ngram", "drafter.kind", ("ngram", "draft_model"), False),
        ("rollout.temperature=0.5,1.0", "rollout.temperature", ("0.5", "1.0"), False),
        ("init=chat,in_domain", "drafter.init.data", ("chat", "in_domain"), False),
        ("seed=-1..1", "seed", ("-1", "0", "1"), False),
        ("grpo.steps=3", "grpo.steps", ("3",), True),
        ("k=5", "drafter.k", ("5",), True),
    ],
)
def test_parse_axis(item, key, values, fixed):
    a = parse_axis(item)
    assert (a.key, a.values, a.fixed) == (key, values, fixed)


@pytest.mark.parametrize(
    "item,needles",
    [
        ("k=5..2", ["axis 'k'", "empty range", "k=2..5"]),
        ("k=1..", ["axis 'k'", "bad range", "k=1..7"]),
        ("k=a..b", ["bad range", "integer"]),
        ("rollout.temperature=0.5..1.0", ["bad range", "commas"]),
        ("k=", ["axis 'k'", "no values", "k=1..7"]),
        ("k=1,,2", ["axis 'k'", "empty value", "comma"]),
        ("micro", ["KEY=VALUES", "spec"]),
        ("=3", ["empty key"]),
    ],
)
def test_bad_axis_grammar_is_a_clear_error(item, needles):
    with pytest.raises(SweepError) as e:
        parse_axis(item)
    for n in needles:
        assert n in str(e.value)


def test_split_axes_and_fixed_and_reject_repeats():
    axes, fixed = parse_sweep_args(["k=1..2", "drafter=ngram,draft_model", "grpo.steps=3"])
    assert [a.key for a in axes] == ["drafter.k", "drafter.kind"] and [a.key for a in fixed] == ["grpo.steps"]
    with pytest.raises(SweepError, match="given twice"):
        parse_sweep_args(["k=1,2", "drafter.k=3"])
    with pytest.raises(SweepError, match="cannot be an axis"):
        parse_sweep_args(["tracking.experiment=a,b"])


def test_expand_grid_is_the_cartesian_product():
    axes, _ = parse_sweep_args(["k=1..3", "drafter=ngram,draft_model"])
    grid = expand_grid(axes)
    assert (
        len(grid) == 6
        and grid[0] == {"drafter.k": "1", "drafter.kind": "ngram"}
        and grid[1]["drafter.kind"] == "draft_model"
    )
    assert expand_grid([]) == [{}]


# ----------------------------------------------------------------------------- planning


def test_baseline_added_first_and_fixed_overrides_apply_everywhere():
    plan = plan_sweep("micro", ["k=1..3", "grpo.steps=5"])
    assert [p.spec.drafter.kind for p in plan.points] == ["none", "draft_model", "draft_model", "draft_model"]
    assert [p.spec.drafter.k for p in plan.points[1:]] == [1, 2, 3]
    assert all(p.spec.grpo.steps == 5 for p in plan.points)
    assert all(p.baseline_key == plan.points[0].key for p in plan.points)


def test_k_with_kind_none_runs_once():
    plan = plan_sweep("micro", ["drafter=none,ngram", "k=1,2"])
    kinds = [(p.spec.drafter.kind, p.spec.drafter.k) for p in plan.points]
    assert kinds[0][0] == "none" and kinds[1:] == [("ngram", 1), ("ngram", 2)]
    assert len({p.key for p in plan.points}) == len(plan.points) == 3


def test_one_baseline_per_non_drafter_combination():
    plan = plan_sweep("micro", ["k=1,2", "seed=0,1"])
    base = {p.spec.seed: p.key for p in plan.points if p.is_baseline}
    assert len(plan.points) == 6 and set(base) == {0, 1}
    assert all(p.baseline_key == base[p.spec.seed] for p in plan.points)


def test_default_spec_is_the_sweep_sized_quickstart():
    plan = plan_sweep(None, ["k=1..7"])
    assert len(plan.points) == 8 and plan.base.model.target == "tiny"
    assert plan.base.grpo.steps < 10 and plan.base.grpo.eval_every == 0


@pytest.mark.parametrize(
    "items,needles",
    [
        (["kk=1,2"], ["axis 'kk'", "unknown key", "aliases"]),
        (["drafter.init.steps=-1,5"], ["axis 'drafter.init.steps'", "'-1'", "greater than or equal to 0"]),
        (["drafter.online.foo=1"], ["drafter.online.foo", "unknown key"]),
        (["k=0..2"], ["axis 'k'", "'0'", "drafter.k", "greater than or equal to 1"]),
        (["drafter=foo,ngram"], ["axis 'drafter'", "allowed values"]),
        (["drafter.prompt_lookup_min=2,5"], ["drafter.prompt_lookup_min", "'5'", "prompt_lookup_max"]),
    ],
)
def test_invalid_points_name_the_axis(items, needles):
    with pytest.raises(SweepError) as e:
        plan_sweep("micro", items)
    for n in needles:
        assert n in str(e.value)


def test_cli_errors_exit_2_and_run_nothing(workdir):
    for args in (["k=5..2"], ["micro", "k=1,2", "kk=3,4"], ["micro", "online=maybe,true"]):
        res = runner.invoke(app, ["sweep", *args])
        assert res.exit_code == 2, res.output
        assert "error" in res.output
    assert not (workdir / "mlflow.db").exists()  # MLflow never touched


def test_dry_run_lists_points_and_runs_nothing(workdir):
    res = runner.invoke(app, ["sweep", "micro", "k=1..3", "drafter=ngram,draft_model", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "7 points" in res.output and "ngram" in res.output and "none" in res.output
    assert not (workdir / "mlflow.db").exists()  # MLflow never touched


# ----------------------------------------------------------------------------- results maths


def test_summary_skips_warmup_and_speedup_is_a_ratio():
    hist = [
        {"timing_s/gen": 9.0, "timing_s/step": 10.0, "reward/mean": 0.1},
        {"timing_s/gen": 1.0, "timing_s/step": 2.0, "reward/mean": 0.2},
        {"timing_s/gen": 3.0, "timing_s/step": 4.0, "reward/mean": 0.3},
    ]
    s = summarize(hist)
    assert (s["timing_s/gen"], s["timing_s/step"], s["reward/final"], s["spec/acceptance_length"]) == (
        2.0,
        3.0,
        0.3,
        None,
    )
    assert summarize(hist[:1])["timing_s/gen"] == 9.0  # one step: nothing to skip
    assert speedup(2.0, 0.5) == 4.0 and speedup(None, 1.0) is None and speedup(1.0, 0.0) is None


def test_summary_keeps_first_and_last_acceptance_length():
    hist = [{"spec/acceptance_length": 1.5}, {"spec/acceptance_length": 2.0}, {"spec/acceptance_length": 2.5}]
    s = summarize(hist)
    assert (s["spec/acceptance_length_first"], s["spec/acceptance_length_last"], s["spec/acceptance_length"]) == (
        1.5,
        2.5,
        2.25,
    )
    assert summarize([{"timing_s/gen": 1.0}])["spec/acceptance_length_first"] is None  # drafter none


# ----------------------------------------------------------------------------- running


def test_micro_sweep_logs_parent_children_speedups_and_resumes(store):
    args = ["sweep", "micro", "k=1,2", "grpo.eval_every=0", "--name", "s1", "--quiet"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    parent, children = _sweep_runs(store, "s1")
    assert parent.info.status == "FINISHED" and parent.data.tags["workbench.axis.drafter.k"] == "1,2"
    # k=1,2: a curve
    assert {"results.json", "speedup_vs_k.png"} <= {a.path for a in store.list_artifacts(parent.info.run_id)}
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    by_k = {c.data.tags["workbench.axis.drafter.k"]: c for c in children}
    assert set(by_k) == {"-", "1", "2"} and by_k["-"].data.params["drafter.kind"] == "none"
    assert by_k["2"].data.params["drafter.k"] == "2" and by_k["2"].data.tags["workbench.sweep"] == "s1"
    assert not any(k.startswith("speedup/") for k in by_k["-"].data.metrics)  # nothing to pair plain decoding with
    assert by_k["-"].data.params["measure.paired"] == "True"  # the sweep turns pairing on (spec: null)
    for k in ("1", "2"):
        c = by_k[k]
        hist = store.get_metric_history(c.info.run_id, "speedup/gen_per_step")
        assert sorted(x.step for x in hist) == [1, 2]  # one paired ratio per GRPO step
        ar = {x.step: x.value for x in store.get_metric_history(c.info.run_id, "timing_s/gen_autoregressive")}
        gen = {x.step: x.value for x in store.get_metric_history(c.info.run_id, "timing_s/gen")}
        assert {x.step: x.value for x in hist} == pytest.approx({s: ar[s] / gen[s] for s in (1, 2)})
        m = c.data.metrics
        assert m["speedup/gen_mean"] == pytest.approx(ar[2] / gen[2])  # micro: 2 steps, warm-up step 1 left out
        assert m["speedup/gen_n"] == 1 and "speedup/step_mean" in m
        assert m["speedup/gen"] == pytest.approx(m["speedup/gen_mean"])  # the column MLflow shows: the run's estimate
    path = store.download_artifacts(parent.info.run_id, "results.json")
    rows = json.loads(open(path).read())["rows"]
    assert [r["speedup/gen"]["paired"] for r in rows if not r["baseline"]] == [True, True]
    decided = json.loads(open(path).read())
    assert decided["best"] or decided["tie"]  # one of the two is always stated (the table says which)

    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert again.output.count("skipped") >= 3 and "resuming" in again.output
    _, children2 = _sweep_runs(store, "s1")
    assert len(children2) == 3


def test_failed_point_fails_the_sweep_and_resume_reruns_only_it(store, monkeypatch):
    """A fake run_experiment (real MLflow child runs, no training) makes point k=2 crash once."""
    import workbench.experiment as experiment
    from workbench.experiment import RunResult

    crash = {"k": 2}

    def fake_run(
        spec, console=None, progress=True, parent_run_id=None, tags=None, summary=True, on_step=None, run_id=None
    ):
        t = spec.tracking
        hist = []
        gen = 1.0 if spec.drafter.kind == "none" else 1.0 / (1 + spec.drafter.k)
        with Tracker(
            t.tracking_uri, t.experiment, run_name=t.run_name, tags=tags, parent_run_id=parent_run_id, run_id=run_id
        ) as tr:
            tr.log_params(spec.flat_params())
            if spec.drafter.kind != "none" and spec.drafter.k == crash["k"]:
                raise RuntimeError("boom")
            for step, warm in ((1, 100.0), (2, 0.0)):
                m = {"timing_s/gen": gen + warm, "timing_s/step": 2 * gen + warm, "reward/mean": 0.5}
                tr.log_metrics(m, step=step)
                hist.append(m)
        return RunResult(tr.run_id, tr.tracking_uri, hist)

    monkeypatch.setattr(experiment, "run_experiment", fake_run)
    args = ["sweep", "micro", "k=1,2", "--name", "s2", "--quiet"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "FAILED" in res.output and "boom" in res.output
    parent, children = _sweep_runs(store, "s2")
    assert parent.info.status == "FAILED"
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED", "FINISHED"]
    path = store.download_artifacts(parent.info.run_id, "results.json")
    results = json.loads(open(path).read())
    assert [r["points"][0]["status"] for r in results["rows"]] == ["ok", "ok", "failed"]
    k1 = results["rows"][1]["speedup/gen"]  # unpaired (the fake logs no paired ratios): ~ baseline s / point s
    assert k1["mean"] == pytest.approx(2.0) and k1["paired"] is False and k1["ci95_low"] is None  # warm-up excluded
    k1_run = [c for c in children if c.data.tags["workbench.axis.drafter.k"] == "1"][0]
    assert k1_run.data.metrics["speedup/gen_unpaired"] == pytest.approx(2.0)

    crash["k"] = None
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert res.output.count("skipped") >= 2
    parent, children = _sweep_runs(store, "s2")
    assert parent.info.status == "FINISHED"
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    k2 = [c for c in children if c.info.status == "FINISHED" and c.data.tags["workbench.axis.drafter.k"] == "2"]
    assert k2[0].data.metrics["speedup/gen_unpaired"] == pytest.approx(3.0)


# ----------------------------------------------------------------------------- paired results, ties, repeats


def _outcomes(plan, ratios_of, stored="per_step"):
    """Outcomes with synthetic 4-step histories whose paired speedup/gen per step is ratios_of(point):
    as logged now (``speedup/gen_per_step`` beside a running estimate ``speedup/gen`` that must not be
    read as ratios), or ``stored="before_per_step"``: the per-step ratios under ``speedup/gen``."""
    from workbench.sweep.results import Outcome

    out = []
    for p in plan.points:
        hist = [{"timing_s/gen": 1.0, "timing_s/step": 2.0, "reward/mean": 0.5} for _ in range(4)]
        if not p.is_baseline:
            for h, r in zip(hist, ratios_of(p)):
                if stored == "per_step":
                    h["speedup/gen_per_step"], h["speedup/step_per_step"] = r, 1 + (r - 1) / 2
                    h["speedup/gen"] = h["speedup/step"] = 50.0
                else:
                    h["speedup/gen"], h["speedup/step"] = r, 1 + (r - 1) / 2
        out.append(Outcome(p, "ok", "run", hist, 1))
    return out


@pytest.mark.parametrize("stored", ["per_step", "before_per_step"])
def test_best_is_called_only_when_its_interval_clears_the_rest(stored):
    from workbench.sweep import results_json

    plan = plan_sweep("micro", ["k=1,2,3"])
    sep = {1: [9, 1.10, 1.12, 1.11], 2: [9, 1.50, 1.52, 1.51], 3: [9, 1.30, 1.31, 1.29]}  # step 1 is warm-up
    res = results_json("s", plan, _outcomes(plan, lambda p: sep[p.spec.drafter.k], stored))
    assert res["best"] == "draft_model k=2" and res["tie"] == []
    wide = {1: [9, 1.10, 1.12, 1.11], 2: [9, 1.35, 1.45, 1.40], 3: [9, 1.30, 1.31, 1.29]}  # k=2 noisy: reaches k=3
    res = results_json("s", plan, _outcomes(plan, lambda p: wide[p.spec.drafter.k], stored))
    assert res["best"] is None and res["tie"] == ["draft_model k=2", "draft_model k=3"]
    k2 = [r for r in res["rows"] if r["label"] == "draft_model k=2"][0]["speedup/gen"]
    assert k2["ci95_low"] < 1.29 < k2["ci95_high"] and k2["n"] == 3


def test_speedup_vs_k_plot_of_the_sweep_rows(tmp_path):
    """The parent run's ``speedup_vs_k.png`` (MLflow's compare page cannot be linked to k vs speedup)."""
    from workbench.sweep import sweep_rows
    from workbench.sweep.plot import speedup_lines, speedup_vs_k_png

    plan = plan_sweep("micro", ["k=1,2,3"])
    rows = sweep_rows(
        _outcomes(plan, lambda p: [9, 1.1 * p.spec.drafter.k, 1.12 * p.spec.drafter.k, 1.11 * p.spec.drafter.k])
    )
    lines = speedup_lines(rows)
    assert list(lines) == ["draft_model"] and [k for k, _, _ in lines["draft_model"]] == [1, 2, 3]  # baseline left out
    assert lines["draft_model"][1][1].mean == pytest.approx((1.1 * 1.12 * 1.11) ** (1 / 3) * 2)
    assert speedup_vs_k_png(rows, tmp_path / "p.png") == tmp_path / "p.png" and (tmp_path / "p.png").stat().st_size > 0
    one = sweep_rows(_outcomes(plan_sweep("micro", ["k=2"]), lambda p: [9, 1.1, 1.2, 1.3]))
    # one point: no curve
    assert speedup_vs_k_png(one, tmp_path / "q.png") is None and not (tmp_path / "q.png").exists()


def test_repeats_add_a_seed_axis_and_pool_into_one_row(tmp_path):
    from workbench.sweep import results_json, results_table, sweep_rows

    plan = plan_sweep("micro", ["k=2"], repeats=3)
    assert sorted(p.spec.seed for p in plan.points) == [0, 0, 1, 1, 2, 2]  # a baseline per seed, then the points
    by_seed = {0: [9, 1.19, 1.21, 1.2], 1: [9, 1.29, 1.31, 1.3], 2: [9, 1.39, 1.41, 1.4]}  # tight steps, spread runs
    outcomes = _outcomes(plan, lambda p: by_seed[p.spec.seed])
    rows = sweep_rows(outcomes)
    assert len(rows) == 2 and len(rows[1].outcomes) == 3
    # 3 runs: the random-effects interval over them (n = runs), which spans the runs the pooled steps' CI misses
    pooled = ratio_ci([x for s in by_seed.values() for x in s[1:]])
    assert (
        rows[1].gen.n == 3 and rows[1].gen.mean == pytest.approx(pooled.mean, rel=1e-3) and rows[1].gen_runs.tau > 0.05
    )
    assert rows[1].gen.low < 1.2 < pooled.low and rows[1].gen.high > 1.4 > pooled.high and rows[1].step_runs is not None
    res = results_json("s", plan, outcomes)["rows"][1]
    assert "seed" not in res["axes"]  # repeats are one row, not an axis column
    assert res["speedup/gen"]["interval"] == "runs" and res["speedup/gen"]["tau"] == pytest.approx(rows[1].gen_runs.tau)
    assert res["speedup/gen"]["pred95_low"] < rows[1].gen.low  # a new run's estimate: wider than the mean's CI
    flat = sweep_rows(_outcomes(plan, lambda p: [9, 1.2, 1.2, 1.2]))[1]  # no within-run variance: steps pooled
    assert flat.gen_runs is None and flat.gen.n == 9
    with pytest.raises(SweepError, match="--repeats"):
        plan_sweep("micro", ["seed=0,1"], repeats=2)
    from rich.console import Console

    con = Console(record=True, width=250)
    con.print(results_table(plan, outcomes, "t"))
    text = con.export_text()
    assert "1.30× [" in text and "tie for best" not in text  # one speculative row: nothing to tie with
    # τ column, caption
    assert f"{math.expm1(rows[1].gen_runs.tau) * 100:.1f} %" in text and "not of a repeat" in " ".join(text.split())
