"""Completion lengths: the TRL-named step scalars, the per-row record a run logs, and the simulator's
use of them (measured groups resampled, the grouped lognormal, the within-prompt ICC)."""

import math

import numpy as np
import pytest

from workbench.grpo.completions import FORMAT, completion_metrics, lengths_record
from workbench.perf.simulate.lengths import (
    MeasuredLengths,
    NoLengthsLogged,
    grouped_lognormal,
    icc_log,
    parse_record,
    read_run_lengths,
)


def test_completion_metrics_by_hand():
    m = completion_metrics([3, 5, 10], ["stop", "stop", "length"])
    assert m == {
        "completions/mean_length": 6.0,
        "completions/min_length": 3.0,
        "completions/max_length": 10.0,
        "completions/clipped_ratio": pytest.approx(1 / 3),
        "completions/frac_stop": pytest.approx(2 / 3),
    }
    with pytest.raises(ValueError, match="one finish reason per completion"):
        completion_metrics([3, 5], ["stop"])


def test_lengths_record_keeps_groups_and_refuses_a_ragged_batch():
    rec = lengths_record([4, 4, 7, 7], 2, 16)
    assert rec == {"format": FORMAT, "group_size": 2, "max_new_tokens": 16, "lengths": [4, 4, 7, 7]}
    assert parse_record(rec, "here")[2].tolist() == [4, 4, 7, 7]
    with pytest.raises(ValueError, match="group_size=3"):
        lengths_record([1, 2, 3, 4], 3, 16)
    with pytest.raises(ValueError, match="here: not a completion-lengths record"):
        parse_record({**rec, "lengths": [1, 2, 3]}, "here")
    with pytest.raises(ValueError, match="format"):
        parse_record({**rec, "format": "other/1"}, "here")
    for bad in ([4, 0, 7, 7], [4, 4.5, 7, 7]):
        with pytest.raises(ValueError, match="whole numbers of tokens ≥ 1"):
            parse_record({**rec, "lengths": bad}, "here")


def test_icc_by_hand():
    # log lengths [[0, 2], [2, 4]]: group means 1, 3, grand 2; MSB = 2·(1 + 1)/1 = 4, MSW = 4/(2·1) = 2
    assert icc_log(np.exp([[0.0, 2.0], [2.0, 4.0]])) == pytest.approx((4 - 2) / (4 + 2))
    assert icc_log([[5, 5], [9, 9]]) == 1.0  # rows of a prompt alike, prompts differ
    assert icc_log([[5, 9], [9, 5]]) == 0.0  # all spread within (ICC(1) = −1, clipped)
    assert icc_log([[5], [9]]) == 0.0 and icc_log([[5, 9]]) == 0.0  # G = 1, one group: undefined -> 0


@pytest.mark.parametrize("icc", [0.0, 0.6])
def test_grouped_lognormal_has_the_given_marginal_and_correlation(icc):
    x = grouped_lognormal(20000, 4, 300.0, 0.8, icc, 10**9, np.random.default_rng(0))
    assert x.shape == (80000,)
    assert x.mean() == pytest.approx(300, rel=0.02) and x.std() / x.mean() == pytest.approx(0.8, rel=0.05)
    assert icc_log(x.reshape(-1, 4)) == pytest.approx(icc, abs=0.02)
    assert grouped_lognormal(3, 2, 7.4, 0.0, icc, 100, np.random.default_rng(0)).tolist() == [7] * 6
    assert grouped_lognormal(500, 2, 300.0, 2.0, icc, 1000, np.random.default_rng(0)).max() == 1000  # cut at max


def _measured():
    return MeasuredLengths(2, 16, [np.array([4, 4, 10, 10]), np.array([6, 6, 16, 16])])


def test_measured_lengths_stats_and_draws():
    m = _measured()
    assert m.groups.tolist() == [[4, 4], [10, 10], [6, 6], [16, 16]]
    assert m.mean == 9.0 and m.icc == 1.0 and m.clipped == 0.25
    assert m.cv == pytest.approx(np.std([4, 4, 10, 10, 6, 6, 16, 16]) / 9)
    draws = m.step_draws(5, np.random.default_rng(0))
    assert len(draws) == 5 and all(d.tolist() in ([4, 4, 10, 10], [6, 6, 16, 16]) for d in draws)
    assert "2 steps x 4 rows" in m.describe() and "ICC 1.00" in m.describe()


def test_measured_lengths_resample_whole_groups_scaled_and_cut():
    m, rng = _measured(), np.random.default_rng(1)
    x = m.resample(50, 2, rng).reshape(50, 2)
    assert (x[:, 0] == x[:, 1]).all() and set(x[:, 0]) == {4, 10, 6, 16}  # each prompt one measured group
    x3 = m.resample(50, 3, rng).reshape(50, 3)  # another G: no spread within the measured groups, none here
    assert (x3 == x3[:, :1]).all()
    scaled = m.resample(2000, 2, rng, mean=900.0)
    assert scaled.mean() == pytest.approx(900, rel=0.05) and set(scaled) == {400, 1000, 600, 1600}  # x 100
    assert m.resample(200, 2, rng, mean=900.0, max_len=1000).max() == 1000


def test_resample_to_another_group_size_keeps_levels_and_spreads_rows():
    """G 2 -> 8: a prompt's level from one measured group, its rows' deviations from all groups' (two-level
    bootstrap)."""
    m = MeasuredLengths(2, 1000, [np.array([10, 20, 100, 300, 50, 55])])
    x = m.resample(4000, 8, np.random.default_rng(3)).reshape(4000, 8)
    levels = np.log([math.sqrt(200), math.sqrt(30000), math.sqrt(2750)])  # the measured groups' geometric means
    off = np.abs(np.log(x).mean(axis=1)[:, None] - levels[None, :]).min(axis=1)
    assert np.median(off) < 0.15  # each prompt sits near one measured group's level
    # rows spread past the measured
    assert (x.std(axis=1) > 0).mean() > 0.95 and not set(x.ravel()) <= {
        10,
        20,
        100,
        300,
        50,
        55,
    }
    assert 0.5 < icc_log(x) < 0.99


def _log_lengths(client, run_id, steps):
    for i, (g, x) in enumerate(steps, 1):
        client.log_dict(run_id, lengths_record(x, g, 16), f"completions/lengths/step_{i:05d}.json")


def test_read_run_lengths_and_its_refusals(store):
    exp = store.create_experiment("lengths")
    a, b, none, bad = (store.create_run(exp).info.run_id for _ in range(4))
    _log_lengths(store, a, [(2, [4, 4, 10, 10]), (2, [6, 6, 16, 16])])
    _log_lengths(store, b, [(4, [1, 2, 3, 4])])
    store.log_text(bad, "{not json", "completions/lengths/step_00001.json")
    uri = store.tracking_uri
    m = read_run_lengths([a], uri)
    assert (
        m.group_size == 2
        and m.max_new_tokens == 16
        and [s.tolist() for s in m.steps] == [[4, 4, 10, 10], [6, 6, 16, 16]]
    )
    with pytest.raises(NoLengthsLogged, match=f"run {none} logged no completion lengths.*re-run"):
        read_run_lengths([a, none], uri)
    with pytest.raises(ValueError, match="group_size 4, max_new_tokens 16; earlier records 2, 16"):
        read_run_lengths([a, b], uri)
    c = store.create_run(exp).info.run_id
    store.log_dict(c, lengths_record([5, 5], 2, 32), "completions/lengths/step_00001.json")
    with pytest.raises(ValueError, match="max_new_tokens 32; earlier records 2, 16"):
        read_run_lengths([a, c], uri)
    assert read_run_lengths([a], uri).origins == [
        f"run {a}, completions/lengths/step_00001.json",
        f"run {a}, completions/lengths/step_00002.json",
    ]
    with pytest.raises(ValueError, match=f"run {bad}, completions/lengths/step_00001.json: unreadable"):
        read_run_lengths([bad], uri)


def test_scenario_takes_a_runs_lengths(store):
    """workload.response.kind=run: the scenario's prompts × G rows are the run's groups, resampled (and rescaled)."""
    from workbench.perf.simulate.rollout import response_lengths
    from workbench.perf.simulate.scenario import load_scenario

    exp = store.create_experiment("lengths-scenario")
    rid = store.create_run(exp).info.run_id
    _log_lengths(store, rid, [(2, [40, 40, 100, 100])])
    _, sc = load_scenario(
        "qwen3-8b-gb200",
        [
            "workload.response.kind=run",
            f"workload.response.run={rid}",
            f"workload.response.tracking_uri={store.tracking_uri}",
            "workload.response.scale_mean=1400",
            "workload.group_size=2",
            "workload.prompts=64",
        ],
    )
    x = response_lengths(sc).reshape(64, 2)
    assert (x[:, 0] == x[:, 1]).all() and set(x[:, 0]) == {800, 2000}  # 40, 100 x 1400 / 70
    with pytest.raises(Exception, match="kind: run needs workload.response.run"):
        load_scenario("qwen3-8b-gb200", ["workload.response.kind=run"])


def test_scenario_takes_a_sweeps_lengths_by_name(store):
    """workload.response.run may name a sweep: its FINISHED runs' lengths, pooled."""
    from workbench.perf.simulate.rollout import run_lengths

    from test_runs import log_run

    exp = store.create_experiment("lengths-sweep")
    parent = log_run(store, exp, "lensweep", tags={"workbench.sweep": "lensweep", "workbench.sweep.role": "parent"})
    a = log_run(
        store, exp, "lensweep: a", tags={"workbench.sweep": "lensweep", "workbench.sweep.role": "point"}, parent=parent
    )
    b = log_run(
        store, exp, "lensweep: b", tags={"workbench.sweep": "lensweep", "workbench.sweep.role": "point"}, parent=parent
    )
    _log_lengths(store, a, [(2, [40, 40, 100, 100])])
    _log_lengths(store, b, [(2, [7, 7, 9, 9]), (2, [5, 5, 3, 3])])
    m = run_lengths(("lensweep",), store.tracking_uri)
    assert len(m.steps) == 3 and sorted(s.tolist()[0] for s in m.steps) == [5, 7, 40]
    with pytest.raises(ValueError, match="no sweep, study, run name, run id or experiment 'nosuch'"):
        run_lengths(("nosuch",), store.tracking_uri)


def test_run_logs_lengths_for_each_step(store):
    """A real (micro) GRPO run logs the TRL scalars and one grouped record per step, which read back."""
    from workbench.experiment import run_experiment
    from workbench.specs import load_spec

    res = run_experiment(load_spec("micro", ["grpo.steps=2"]), progress=False)
    run = store.get_run(res.run_id)
    for key in (
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "completions/mean_length",
    ):
        assert key in run.data.metrics, key
    m = read_run_lengths([res.run_id], store.tracking_uri)
    spec = load_spec("micro")
    assert len(m.steps) == 2 and m.group_size == spec.grpo.group_size
    assert m.steps[0].size == spec.grpo.prompts_per_step * spec.grpo.group_size
    # the engine's own token counter (gen/num_tokens) agrees with the logged rows, step by step
    tokens = [x.value for x in store.get_metric_history(res.run_id, "gen/num_tokens")]
    assert [int(s.sum()) for s in m.steps] == [int(t) for t in tokens]
    assert m.steps[-1].max() == run.data.metrics["completions/max_length"]


def test_cli_simulate_takes_a_runs_lengths_and_refuses_a_run_without(store):
    from typer.testing import CliRunner

    from workbench.cli import app

    exp = store.create_experiment("lengths-cli")
    rid, empty = (store.create_run(exp).info.run_id for _ in range(2))
    _log_lengths(store, rid, [(2, [40, 40, 100, 100]), (2, [60, 60, 10, 10])])
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "simulate",
            "qwen3-8b-gb200",
            "workload.response.kind=run",
            f"workload.response.run={rid}",
            "workload.response.scale_mean=3000",
            "--no-track",
        ],
        terminal_width=200,
    )
    assert ok.exit_code == 0, ok.output
    text = " ".join(ok.output.split())  # the console wraps long lines
    assert (
        f"response lengths: {rid} (1 run): 2 steps x 4 rows, mean 52.5 tokens" in text and "scaled to mean 3000" in text
    )
    bad = runner.invoke(
        app,
        ["simulate", "qwen3-8b-gb200", "workload.response.kind=run", f"workload.response.run={empty}", "--no-track"],
        terminal_width=200,
    )
    assert bad.exit_code == 2 and "logged no completion lengths" in bad.output
