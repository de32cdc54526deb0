"""`wb tune`: search-space checks, paired objectives, pruning, studies via the CLI, resume, several workers on one
study."""

import io
import os
import socket
import threading
import time

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from rich.console import Console
from typer.testing import CliRunner

import workbench.tune as tune
import workbench.tune.study as tune_study
import workbench.tune.workers as tw
from workbench.cli import app
from workbench.experiment import EarlyStop, RunResult
from workbench.specs import CategoricalParam, FloatParam, IntParam, SpecError, load_spec, validate_spec
from workbench.tracking import Tracker
from workbench.tune import (
    TrialPrunedStop,
    make_storage,
    objective_score,
    open_study,
    plan_tune,
    pruning_hook,
    reported_trials,
    results_json,
    run_study,
    trials_table,
)

runner = CliRunner()
MICRO = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/experiments/micro.yaml"))
SPACE = {
    "drafter.kind": {"type": "categorical", "choices": ["ngram", "draft_model"]},
    "drafter.k": {"type": "int", "low": 1, "high": 4},
}


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def write_spec(path, params=SPACE, **tune):
    raw = {
        **MICRO,
        "grpo": {**MICRO["grpo"], "eval_every": 0},
        "tune": {"params": params, "storage": f"sqlite:///{path.parent}/optuna.db", **tune},
    }
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _runs(client, study, experiment="workbench-micro"):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.study` = '{study}'")
    by_role = {}
    for r in runs:
        by_role.setdefault(r.data.tags["workbench.tune.role"], []).append(r)
    return by_role


# ----------------------------------------------------------------------------- search space


def test_search_space_types_parse():
    t = validate_spec(
        {
            "tune": {
                "params": {
                    "drafter.kind": {"type": "categorical", "choices": ["ngram", "none"]},
                    "drafter.k": {"type": "int", "low": 1, "high": 7, "step": 2},
                    "grpo.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
                }
            }
        }
    ).tune
    p = t.params
    assert isinstance(p["drafter.kind"], CategoricalParam) and p["drafter.kind"].choices == ["ngram", "none"]
    assert isinstance(p["drafter.k"], IntParam) and (p["drafter.k"].low, p["drafter.k"].high, p["drafter.k"].step) == (
        1,
        7,
        2,
    )
    assert isinstance(p["grpo.lr"], FloatParam) and p["grpo.lr"].log
    assert (t.objective, t.sampler, t.pruner, t.storage, t.direction) == (
        "speedup_gen",
        "tpe",
        "median",
        "sqlite:///optuna.db",
        "maximize",
    )


def test_default_tune_section_is_not_dumped():
    s = load_spec("micro")
    assert "tune" not in s.to_yaml() and not any(k.startswith("tune.") for k in s.flat_params())


@pytest.mark.parametrize(
    "space,needles",
    [
        ({"type": "range", "low": 1}, ["tune.params.drafter.k", "'categorical', 'int', 'float'"]),
        ({"type": "int", "low": 5, "high": 2}, ["tune.params.drafter.k", "low (5) must be <= high (2)"]),
        ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, ["log: true needs low > 0"]),
        ({"type": "int", "low": 1, "high": 2, "lo": 3}, ["tune.params.drafter.k", "unknown key"]),
        ({"type": "categorical", "choices": []}, ["tune.params.drafter.k", "choices"]),
    ],
)
def test_bad_search_space(space, needles):
    with pytest.raises(SpecError) as e:
        validate_spec({"tune": {"params": {"drafter.k": space}}})
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_grid_needs_discrete_params():
    with pytest.raises(SpecError, match="sampler grid needs categorical or int"):
        validate_spec({"tune": {"sampler": "grid", "params": {"grpo.lr": {"type": "float", "low": 0.1, "high": 0.2}}}})


@pytest.mark.parametrize(
    "params,needles",
    [
        (
            {"drafter.kx": {"type": "int", "low": 1, "high": 3}},
            ["tune.params.drafter.kx", "not a dotted spec key", "Did you mean 'drafter.k'"],
        ),
        (
            {"drafter.k": {"type": "int", "low": 1, "high": 20}},
            ["tune.params.drafter.k: value 20", "drafter.k", "narrow"],
        ),
        (
            {"drafter.kind": {"type": "categorical", "choices": ["ngram", "eagle9"]}},
            ["tune.params.drafter.kind: value 'eagle9'", "allowed values"],
        ),
        (
            {"tracking.experiment": {"type": "categorical", "choices": ["a"]}},
            ["tune.params.tracking.experiment", "cannot be tuned"],
        ),
        ({}, ["no search space"]),
    ],
)
def test_plan_checks_keys_and_values(workdir, params, needles):
    with pytest.raises(SpecError) as e:
        plan_tune(write_spec(workdir / "s.yaml", params=params))
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_plan_defaults_and_trial_spec(workdir):
    plan = plan_tune(write_spec(workdir / "s.yaml"), ["grpo.steps=3"])
    assert plan.name == "micro-tune" and "tune" not in plan.raw
    s = plan.trial_spec({"drafter.kind": "ngram", "drafter.k": 4})
    assert (s.drafter.kind, s.drafter.k, s.grpo.steps, s.tune.params) == ("ngram", 4, 3, {})
    assert plan_tune(None).tune.params  # experiments/tune.yaml has a search space


# ----------------------------------------------------------------------------- objective / pruning (pure)

T975_1 = 12.706204736  # Student t quantile 0.975 with 1 degree of freedom


def test_objective_score_is_the_paired_geometric_mean_after_warmup():
    hist = [
        {"speedup/gen_per_step": 5.0, "speedup/step_per_step": 9.0, "gen/tokens_per_s": 1.0},
        {"speedup/gen_per_step": 2.0, "speedup/step_per_step": 1.0, "gen/tokens_per_s": 100.0},
        {"speedup/gen_per_step": 8.0, "speedup/step_per_step": 4.0, "gen/tokens_per_s": 200.0},
    ]
    for h in hist:  # the running estimates beside the ratios: not what the objective reads
        h["speedup/gen"] = h["speedup/step"] = 66.0
    s = objective_score("speedup_gen", hist)  # step 1 = warm-up, dropped: sqrt(2 * 8) = 4
    # logs ln 2, ln 8: sd = sqrt(2) ln 2, half-width = t * sd / sqrt(2) = t ln 2
    assert (s.value, s.n) == (pytest.approx(4.0), 2)
    assert s.low == pytest.approx(4 / 2**T975_1) and s.high == pytest.approx(4 * 2**T975_1)
    assert objective_score("speedup_step", hist).value == pytest.approx(2.0)  # sqrt(1 * 4)
    assert objective_score("speedup_gen", hist, warmup=0).value == pytest.approx(80 ** (1 / 3))
    one = objective_score("speedup_gen", hist[:1])  # shorter than the warm-up: kept, no interval
    assert (one.value, one.low, one.high, one.n) == (pytest.approx(5.0), None, None, 1)
    tps = objective_score("gen_tokens_per_s", hist)
    assert (tps.value, tps.low, tps.n) == (150.0, None, 2)
    assert objective_score("speedup_gen", [{"timing_s/gen": 1.0}] * 3) is None  # not paired: nothing to score
    none = objective_score("speedup_gen", hist, drafter_kind="none")  # plain decoding: 1.0 by definition
    assert (none.value, none.low, none.high, none.n) == (1.0, None, None, 2)
    with pytest.raises(ValueError, match="unknown objective"):
        objective_score("loss", hist)


class FakeTrial:
    def __init__(self, prune_at):
        self.prune_at, self.reported = prune_at, []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return len(self.reported) >= self.prune_at


def test_pruning_hook_reports_running_paired_value_after_warmup():
    trial = FakeTrial(prune_at=2)
    hook = pruning_hook(trial, "speedup_gen", warmup=1)
    hook(1, {"speedup/gen_per_step": 5.0})
    assert trial.reported == []  # warm-up step: nothing to report yet
    hook(2, {"speedup/gen_per_step": 2.0})
    with pytest.raises(TrialPrunedStop) as e:
        hook(3, {"speedup/gen_per_step": 8.0})
    assert trial.reported == [(2, 2.0), (3, pytest.approx(4.0))]  # running geometric mean
    assert isinstance(e.value, optuna.TrialPruned) and isinstance(e.value, EarlyStop)
    assert (
        e.value.tags == {"workbench.pruned": "true"}
        and e.value.step == 3
        and e.value.score.low < 4 < e.value.score.high
    )
    plain = FakeTrial(prune_at=99)
    hook = pruning_hook(plain, "speedup_step", warmup=1, drafter_kind="none")
    hook(1, {})
    hook(2, {})
    assert plain.reported == [(2, 1.0)]


@pytest.mark.parametrize(
    "overrides,params,needle",
    [
        (["measure.paired=false"], SPACE, "the spec sets measure.paired: false"),
        (
            [],
            {**SPACE, "measure.paired": {"type": "categorical", "choices": [True, False]}},
            "tune.params.measure.paired allows false",
        ),
    ],
)
def test_unpaired_speedup_objective_is_refused_at_plan_time(workdir, overrides, params, needle):
    spec = write_spec(workdir / "s.yaml", params=params)
    with pytest.raises(SpecError) as e:
        plan_tune(spec, overrides)
    assert needle in str(e.value) and "measure.paired=true" in str(e.value) and "gen_tokens_per_s" in str(e.value)
    plan_tune(spec, [*overrides, "tune.objective=gen_tokens_per_s"])  # no speedup: no pairing needed
    plan_tune(write_spec(workdir / "ok.yaml"), ["measure.paired=true"])


# ---------------------------------------------------------------------------- studies (fake runs, real Optuna + MLflow)

# per-step factor: step 1 (warm-up) is off; steps 2-3 multiply to 1
JITTER = {
    1: 0.2,
    2: 1.1,
    3: 1 / 1.1,
    4: 1.0,
    5: 1.0,
    6: 1.0,
}


def fake_runner(calls, slow_after=None, delay=0.0, fail_first=None):
    """run_experiment stand-in: real MLflow runs (unless tracking is off), no training.

    A trial's true paired speedup is 1 + k (steps 2-3 have geometric mean exactly 1 + k); runs with
    ``drafter.kind=none`` log no ``speedup/*`` (nothing to pair), as the trainer. ``slow_after``: runs
    after this many are 10x slower (to be pruned). ``fail_first``: the first run raises it.
    Emulates EarlyStop like run_experiment.
    """

    def fake_run(spec, console=None, progress=True, parent_run_id=None, tags=None, summary=True, on_step=None):
        calls.append(spec)
        if fail_first is not None and len(calls) == 1:
            raise fail_first
        t = spec.tracking
        speed = (1.0 + spec.drafter.k) / (10 if slow_after is not None and len(calls) > slow_after else 1)
        hist = []
        with Tracker(
            t.tracking_uri, t.experiment, run_name=t.run_name, enabled=t.enabled, tags=tags, parent_run_id=parent_run_id
        ) as tr:
            tr.log_params(spec.flat_params())
            for step in range(1, spec.grpo.steps + 1):
                time.sleep(delay)
                m = {"timing_s/gen": 1 / speed, "gen/tokens_per_s": 10 * speed * JITTER[step], "reward/mean": 0.5}
                if spec.paired:
                    m.update(
                        {
                            "speedup/gen_per_step": speed * JITTER[step],
                            "speedup/step_per_step": (1 + speed) / 2 * JITTER[step],
                        }
                    )
                tr.log_metrics(m, step=step)
                hist.append(m)
                if on_step:
                    try:
                        on_step(step, m)
                    except EarlyStop as e:
                        e.run_id = tr.run_id
                        tr.set_tags({"workbench.stopped_early": "true", **e.tags})
                        tr.end("FINISHED")
                        raise
        return RunResult(tr.run_id, tr.tracking_uri, hist)

    return fake_run


def _console():
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def _render(table) -> str:
    console, buf = _console()
    console.print(table)
    return buf.getvalue()


@pytest.fixture()
def fake(monkeypatch):
    import workbench.experiment as experiment

    calls = []

    def install(**kw):
        monkeypatch.setattr(experiment, "run_experiment", fake_runner(calls, **kw))
        return calls

    monkeypatch.setattr(tw, "POLL_S", 0.05)
    return install


def test_cli_study_paired_objective_resume_no_baseline(workdir, fake):
    calls = fake()
    spec = write_spec(workdir / "s.yaml")
    res = runner.invoke(app, ["tune", spec, "grpo.steps=3", "--trials", "3", "--study", "st", "--quiet"])
    assert res.exit_code == 0, res.output
    assert len(calls) == 3 and all(c.drafter.kind != "none" and c.paired for c in calls)  # trials only, all paired
    out = workdir / "best-st.yaml"
    assert out.is_file() and "best trial" in res.output and "wb run" in res.output
    best = load_spec(str(out))
    study = optuna.load_study(study_name="st", storage=f"sqlite:///{workdir}/optuna.db")
    assert (
        best.drafter.k == study.best_trial.params["drafter.k"]
        and best.drafter.kind == study.best_trial.params["drafter.kind"]
    )
    assert best.tune.params == {} and "tune" not in out.read_text().split("\n", 3)[3]
    # no baseline
    assert set(study.user_attrs) == {"objective", "spec"} and study.user_attrs["objective"] == "speedup_gen"
    for t in study.trials:
        k, a = t.params["drafter.k"], t.user_attrs
        assert t.value == pytest.approx(1 + k)  # geometric mean of (1+k)*1.1 and (1+k)/1.1
        assert a["ci95_low"] == pytest.approx((1 + k) / 1.1**T975_1) and a["ci95_high"] == pytest.approx(
            (1 + k) * 1.1**T975_1
        )
        assert (a["n_steps"], a["steps"], a["host"], a["pid"]) == (2, 3, socket.gethostname(), os.getpid())
        assert f"{t.value:.4g} [{a['ci95_low']:.3g}, {a['ci95_high']:.3g}]" in res.output

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    roles = _runs(client, "st")
    assert set(roles) == {"parent", "trial"} and len(roles["parent"]) == 1 and len(roles["trial"]) == 3
    parent = roles["parent"][0]
    assert parent.info.status == "FINISHED" and "results.json" in {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }
    for r in roles["trial"]:
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id and r.info.status == "FINISHED"
        k = int(r.data.tags["workbench.param.drafter.k"])
        assert r.data.metrics["tune/objective"] == pytest.approx(1 + k) and "workbench.tune.trial" in r.data.tags
        assert r.data.metrics["tune/objective_ci95_low"] == pytest.approx((1 + k) / 1.1**T975_1)
        assert r.data.tags["workbench.host"] == socket.gethostname()
        assert r.info.run_id in {t.user_attrs["mlflow_run_id"] for t in study.trials}

    again = runner.invoke(app, ["tune", spec, "grpo.steps=3", "--trials", "5", "--study", "st", "--quiet"])
    assert again.exit_code == 0, again.output
    assert "3 trials done, 2 to run" in again.output and len(calls) == 5
    assert len(optuna.load_study(study_name="st", storage=f"sqlite:///{workdir}/optuna.db").trials) == 5
    roles = _runs(client, "st")
    assert len(roles["parent"]) == 1 and len(roles["trial"]) == 5

    same = runner.invoke(app, ["tune", spec, "--trials", "5", "--study", "st", "--quiet"])
    assert same.exit_code == 0 and "0 to run" in same.output and len(calls) == 5

    other = runner.invoke(
        app, ["tune", spec, "tune.objective=speedup_step", "--trials", "6", "--study", "st", "--quiet"]
    )
    assert other.exit_code == 2 and "optimizes speedup_gen" in other.output


def test_drafter_none_trial_scores_exactly_one(workdir, fake):
    calls = fake()
    plan = plan_tune(
        write_spec(workdir / "s.yaml", params={"drafter.kind": {"type": "categorical", "choices": ["none"]}}),
        ["grpo.steps=3"],
        study_name="plain",
    )
    console, _ = _console()
    res = run_study(plan, 1, console=console, progress=False)
    t = res.study.trials[0]
    assert not calls[0].paired and t.value == 1.0 and "ci95_low" not in t.user_attrs and t.user_attrs["n_steps"] == 2


def test_median_pruner_prunes_slow_trial(workdir, fake):
    fake(slow_after=1)
    spec = write_spec(
        workdir / "s.yaml",
        params={"drafter.k": {"type": "categorical", "choices": [3]}},
        startup_trials=1,
        objective="gen_tokens_per_s",
    )
    res = runner.invoke(
        app, ["tune", spec, "grpo.steps=6", "--trials", "2", "--study", "pr", "--quiet", "--out", "sub/b.yaml"]
    )
    assert res.exit_code == 0, res.output
    study = optuna.load_study(study_name="pr", storage=f"sqlite:///{workdir}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"] and study.trials[1].last_step == 4
    # reports from after the warm-up step; pruned at the 3rd
    assert list(study.trials[1].intermediate_values) == [
        2,
        3,
        4,
    ]
    assert "pruned at step 4" in res.output and (workdir / "sub/b.yaml").is_file()
    roles = _runs(MlflowClient(f"sqlite:///{workdir}/mlflow.db"), "pr")
    pruned = [r for r in roles["trial"] if r.data.tags.get("workbench.pruned") == "true"]
    assert len(pruned) == 1 and pruned[0].info.status == "FINISHED" and "tune/objective" in pruned[0].data.metrics


def test_failed_trial_does_not_count_and_a_rerun_tops_up(workdir, fake):
    calls = fake(fail_first=RuntimeError("boom"))
    spec = write_spec(workdir / "s.yaml")
    res = runner.invoke(app, ["tune", spec, "grpo.steps=3", "--trials", "2", "--study", "f", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "trial 0 failed" in res.output and "boom" in res.output
    again = runner.invoke(app, ["tune", spec, "grpo.steps=3", "--trials", "2", "--study", "f", "--quiet"])
    assert "1 trials done, 1 to run" in again.output and len(calls) == 3
    study = optuna.load_study(study_name="f", storage=f"sqlite:///{workdir}/optuna.db")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE", "COMPLETE"]


def test_ctrl_c_fails_the_trial_and_kills_the_parent(workdir, fake):
    fake(fail_first=KeyboardInterrupt())
    plan = plan_tune(write_spec(workdir / "s.yaml"), study_name="int")
    console, _ = _console()
    with pytest.raises(KeyboardInterrupt):
        run_study(plan, 2, console=console, progress=False)
    study = optuna.load_study(study_name="int", storage=plan.storage)
    assert [t.state.name for t in study.trials] == ["FAIL"]
    assert _runs(MlflowClient(f"sqlite:///{workdir}/mlflow.db"), "int")["parent"][0].info.status == "KILLED"


# ----------------------------------------------------------------------------- several workers on one study


@pytest.mark.parametrize("race", [False, True])
def test_worker_accounting_target_not_overshot(workdir, fake, monkeypatch, race):
    """Worker A (this test) holds RUNNING trials; worker B (run_study) must count them, never run past
    the total, mark a trial it asked for after A reached the total as surplus, and wait for A."""
    calls = fake()
    plan = plan_tune(write_spec(workdir / "s.yaml"), ["grpo.steps=3"], study_name="acc")
    worker_a = open_study(plan)
    with tw.optuna_quiet():
        held = [worker_a.ask()]  # trial 0: A's, running

    real_wait = tune.wait_for_others

    def wait_then_a_finishes(study, console, poll_s=None):  # A's trials run until B's loop is over
        threading.Timer(0.2, lambda: [worker_a.tell(t, 1.5) for t in held]).start()
        real_wait(study, console, poll_s)

    monkeypatch.setattr(tune_study, "wait_for_others", wait_then_a_finishes)
    if race:  # A asks trial 1 between B's count (1 running < 2) and B's ask: B's trial 2 is surplus
        real_ask = optuna.Study.ask

        def racing_ask(self, *args, **kw):
            if self is not worker_a and len(held) == 1:
                with tw.optuna_quiet():
                    held.append(real_ask(worker_a))
            return real_ask(self, *args, **kw)

        monkeypatch.setattr(optuna.Study, "ask", racing_ask)
    console, buf = _console()
    res = run_study(plan, 2, console=console, progress=False)
    out = buf.getvalue()

    stored = optuna.load_study(study_name="acc", storage=plan.storage).trials
    assert len(calls) == res.ran == (0 if race else 1)
    assert [t.number for t in reported_trials(res.study)] == [0, 1]
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in stored) == 2  # exactly the target
    doc = results_json(plan, res.study)
    assert doc["counted"] == 2 and [t["number"] for t in doc["trials"]] == [0, 1]
    table = _render(trials_table(plan, res.study))
    assert "RUNNING" not in table and "FAIL" not in table
    if race:
        assert len(stored) == 3 and stored[2].state.name == "FAIL" and stored[2].user_attrs["surplus"] is True
        assert "trial 2 not run" in out and "waiting for 2 trials running in other workers" in out
    else:  # A's running trial counted: B ran one trial and asked for no other
        assert len(stored) == 2 and stored[1].user_attrs["host"] == socket.gethostname()
        assert "waiting for 1 trials running in other workers" in out


def test_two_worker_threads_share_the_total_and_print_the_same_table(workdir, fake):
    calls = fake(delay=0.02)
    spec = write_spec(workdir / "s.yaml", sampler="random")
    plan = plan_tune(spec, ["grpo.steps=3", "tracking.enabled=false"], study_name="par")
    results, errors = {}, []

    def worker(i):
        try:
            console, _ = _console()
            results[i] = run_study(plan, 6, console=console, progress=False)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    a, b = results[0], results[1]
    assert _render(trials_table(plan, a.study)) == _render(trials_table(plan, b.study))
    assert results_json(plan, a.study) == results_json(plan, b.study)
    assert results_json(plan, a.study)["counted"] == 6 and len(calls) == a.ran + b.ran == 6
    assert [t.number for t in reported_trials(a.study)] == list(range(6))  # no surplus shown, none missing
    assert all(t.state.name in ("COMPLETE", "PRUNED") and t.user_attrs["host"] for t in reported_trials(a.study))


def test_stale_trial_of_a_killed_worker_is_failed_not_shown_running(workdir, fake, monkeypatch):
    calls = fake()
    monkeypatch.setattr(tw, "HEARTBEAT_INTERVAL_S", 1)
    monkeypatch.setattr(tw, "GRACE_PERIOD_S", 1)
    plan = plan_tune(write_spec(workdir / "s.yaml"), ["grpo.steps=3", "tracking.enabled=false"], study_name="stale")
    storage = make_storage(plan.storage)
    with tw.optuna_quiet():
        dead = open_study(plan, storage).ask()  # another worker's trial, RUNNING
    # that worker sends one heartbeat once this one is waiting for it, then dies: stale 1 s later
    threading.Timer(1.0, storage.record_heartbeat, args=(dead._trial_id,)).start()
    console, buf = _console()
    res = run_study(plan, 1, console=console, progress=False, storage=storage)  # counts it, waits, sees it fail
    assert "waiting for 1 trials running in other workers" in buf.getvalue() and not calls
    assert [t.state.name for t in res.study.trials] == ["FAIL"]
    assert "RUNNING" not in _render(trials_table(plan, res.study))
    res = run_study(plan, 1, console=console, progress=False, storage=storage)  # a re-run tops up
    assert [t.state.name for t in res.study.trials] == ["FAIL", "COMPLETE"] and len(calls) == 1


@pytest.mark.parametrize(
    "error",
    [
        ("ProgrammingError", '(psycopg.errors.DuplicateTable) relation "alembic_version" already exists'),
        ("OperationalError", "(sqlite3.OperationalError) table studies already exists"),
        ("IntegrityError", "(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num"),
    ],
)
def test_storage_of_a_worker_that_lost_the_schema_race_is_opened_on_a_retry(tmp_path, monkeypatch, error):
    """Workers started together on a new database race to create Optuna's tables: each backend
    reports the loser's failure as its own error class; the loser opens the storage on a retry."""
    import sqlalchemy.exc

    real, tries = optuna.storages.RDBStorage, []

    def flaky(*a, **kw):
        tries.append(1)
        if len(tries) == 1:
            raise getattr(sqlalchemy.exc, error[0])(error[1], None, Exception(error[1]))
        return real(*a, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", flaky)
    monkeypatch.setattr(tw.time, "sleep", lambda s: None)
    storage = make_storage(f"sqlite:///{tmp_path / 'o.db'}")
    assert isinstance(storage, real) and len(tries) == 2


def test_storage_error_that_is_not_the_race_is_raised_at_once(tmp_path, monkeypatch):
    import sqlalchemy.exc

    def broken(*a, **kw):
        raise sqlalchemy.exc.ProgrammingError("permission denied for schema public", None, Exception())

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"):
        make_storage(f"sqlite:///{tmp_path / 'o.db'}")


def test_cli_bad_spec_exits_2(workdir):
    res = runner.invoke(
        app, ["tune", write_spec(workdir / "s.yaml", params={"drafter.kx": {"type": "int", "low": 1, "high": 2}})]
    )
    assert res.exit_code == 2 and "tune.params.drafter.kx" in res.output


# ----------------------------------------------------------------------------- real runs (micro models)


def test_real_run_experiment_early_stop_ends_finished(workdir):
    from workbench.experiment import run_experiment

    spec = load_spec("micro", ["grpo.eval_every=0", "grpo.steps=2"])

    def stop(step, metrics):
        raise EarlyStop(tags={"workbench.pruned": "true"})

    with pytest.raises(EarlyStop) as e:
        run_experiment(spec, progress=False, on_step=stop)
    run = MlflowClient(f"sqlite:///{workdir}/mlflow.db").get_run(e.value.run_id)
    assert run.info.status == "FINISHED" and len(e.value.history) == 1
    assert run.data.tags["workbench.pruned"] == "true" and run.data.tags["workbench.stopped_at_step"] == "1"


def test_real_micro_study_paired_best_yaml_loads(workdir):
    spec = write_spec(workdir / "s.yaml", params={"drafter.k": {"type": "int", "low": 1, "high": 2}})  # speedup_gen
    res = runner.invoke(app, ["tune", spec, "--trials", "2", "--study", "real", "--quiet"])
    assert res.exit_code == 0, res.output
    best = load_spec(str(workdir / "best-real.yaml"))
    assert best.drafter.k in (1, 2) and best.model.target == "micro"
    study = optuna.load_study(study_name="real", storage=f"sqlite:///{workdir}/optuna.db")
    for t in study.trials:  # 2 steps, 1 warm-up: one real paired ratio each
        assert t.state.name == "COMPLETE" and t.value > 0 and t.user_attrs["n_steps"] == 1
        assert t.user_attrs["host"] == socket.gethostname()


def test_workers_started_together_draw_different_reproducible_parameters(tmp_path):
    """Two workers (two Study objects, one storage, the same spec seed) ask at the same time: the
    per-trial reseed gives them different parameters; the same trial number always draws the same."""
    import optuna

    from workbench.specs import TuneSpec
    from workbench.tune.space import make_sampler, reseed_for_trial

    t = TuneSpec(params={"drafter.k": {"type": "int", "low": 1, "high": 1000}})
    url = f"sqlite:///{tmp_path}/o.db"

    def worker_draws(name: str, reseed: bool) -> list[int]:
        a, b = (
            optuna.create_study(study_name=name, storage=url, sampler=make_sampler(t, 0), load_if_exists=True)
            for _ in range(2)
        )
        trials = [(a, a.ask()), (b, b.ask())]
        out = []
        for study, tr in trials:
            if reseed:
                reseed_for_trial(study, t, 0, tr.number)
            out.append(tr.suggest_int("drafter.k", 1, 1000))
        return out

    assert len(set(worker_draws("same-seed", reseed=False))) == 1  # the failure this guards against
    first = worker_draws("s1", reseed=True)
    assert first[0] != first[1] and worker_draws("s2", reseed=True) == first
