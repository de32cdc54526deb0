"""wb simulate --from-sweep: each term against hand-computed cases, the measured hardware file and the
cost-curve cache lookup, and the check end to end through the CLI on a hand-logged MLflow sweep
(whose run record is FINISHED, or FAILED when the check raises)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.grpo.completions import lengths_record
from workbench.perf.analytic import CostModel
from workbench.perf.simulate.cpu import ArmTime, arm_time, batches, fit_unknown, row_steps
from workbench.perf.simulate.from_sweep import (
    SweepPoint,
    SweepWorkload,
    chunk_forwards,
    continuous_of,
    decode_forwards,
    fit_length_cv,
)
from workbench.perf.simulate.measured import MeasuredHardware, from_cache
from workbench.perf.steps import DrafterCost

from test_runs import log_run

runner = CliRunner()
MS = 1e-3
FLAT = {"tokens": [1, 1000], "seconds": [MS, MS]}  # every forward 1 ms, whatever the tokens in flight


def test_row_steps_hand_cases():
    rng = np.random.default_rng(0)
    L = np.array([1, 2, 5, 9])
    assert row_steps(L, np.array([1.0]), rng).tolist() == [0, 1, 4, 8]  # autoregressive: L - 1
    assert row_steps(L, np.array([0.0, 1.0]), rng).tolist() == [0, 1, 2, 4]  # 2 tokens a step: ceil((L-1)/2)
    assert row_steps(L, np.array([0.0, 0.0, 0.0, 1.0]), rng).tolist() == [0, 1, 1, 2]  # 4 a step


def test_chunk_forwards_and_length_cv():
    assert chunk_forwards(np.array([3, 5, 2, 2]), 2) == (5 - 1) + (2 - 1)
    assert fit_length_cv(20.0, 4 * 19, rows=16, chunk=4, max_len=96) == 0.0  # constant lengths: each batch 19 forwards
    cv = fit_length_cv(20.0, 4 * 24, rows=16, chunk=4, max_len=96)  # a longer tail needs spread
    assert 0.1 < cv < 1.0
    wl = SweepWorkload("s", "", 16, 4, 96, 20.0, 96.0, cv=cv)
    assert np.mean([chunk_forwards(L, 4) for L in wl.lengths(200)]) == pytest.approx(96.0, rel=0.02)


def test_arm_time_by_hand():
    """rows 4 of 9 tokens in one batch, 1 ms forwards, prompt 1 token (prefill 1 ms), ngram free."""
    hw = MeasuredHardware(
        CostModel("curve", FLAT["tokens"], FLAT["seconds"]), {"ngram k=3": DrafterCost("ngram", 3, "", a=0.5 * MS)}
    )
    wl = SweepWorkload("s", "", 4, 4, 96, 9.0, 8.0, prompt_len=1)
    lengths = wl.lengths(2)
    ar = arm_time(wl, hw, lengths, None)
    assert (ar.base, ar.forwards) == pytest.approx((9 * MS, 8))  # prefill + 8 decode steps
    p = SweepPoint("ngram", 3, [1.0, 1.0, 1.0], 0.0, None, None, [], {})  # 4 tokens a step: 2 steps
    spec = arm_time(wl, hw, lengths, p)
    assert (spec.base, spec.forwards) == pytest.approx((MS + 2 * 1.5 * MS, 2))
    assert spec.weight("verify_overhead_s") == 2 and ar.weight("verify_overhead_s") == 0
    assert spec.weight("draft_overhead_s") == 6 and ar.weight("step_overhead_s") == 8


def test_arm_time_continuous_slots_by_hand():
    """Rows of 8, 2, 2, 8 tokens in 2 slots, 1 ms forwards, prompt 1 token (a prefill forward 1 ms).
    Chunks (8, 2), (2, 8): 7 + 7 decode forwards, 2 prefills = 16 ms. Continuous: decode forwards
    7, 1, 1, 7 in 2 slots: row 0 in A at 0..7, row 1 in B at 0..1, row 2 at 1..2, row 3 at 2..9: 9
    forwards, 3 admissions (rows 0+1, row 2, row 3), each one prefill forward: 12 ms. ngram k=1
    accepting all (2 tokens a step), 0.5 ms a step: steps 4, 1, 1, 4; chunks 4 + 4 steps × 1.5 + 2 =
    14 ms; continuous: B at 0..1, 1..2, 2..6: 6 steps × 1.5 + 3 prefills = 12 ms."""
    hw = MeasuredHardware(
        CostModel("curve", FLAT["tokens"], FLAT["seconds"]), {"ngram k=1": DrafterCost("ngram", 1, "", a=0.5 * MS)}
    )
    L = [np.array([8, 2, 2, 8])]
    p = SweepPoint("ngram", 1, [1.0], 0.0, None, None, [], {})
    assert [b.tolist() for b in batches(L[0], 2, False)] == [[8, 2], [2, 8]] and len(batches(L[0], 2, True)) == 1
    for continuous, ar_s, ar_n, sp_s, sp_n in ((False, 16, 14, 14, 8), (True, 12, 9, 12, 6)):
        wl = SweepWorkload("s", "", 4, 2, 96, 5.0, 0.0, prompt_len=1, continuous=continuous)
        ar, spec = arm_time(wl, hw, L, None), arm_time(wl, hw, L, p)
        assert (ar.base, ar.forwards) == pytest.approx((ar_s * MS, ar_n)), continuous
        assert (spec.base, spec.forwards) == pytest.approx((sp_s * MS, sp_n)), continuous
    assert decode_forwards(L[0], 2) == 14 and decode_forwards(L[0], 2, continuous=True) == 9
    cv_c = fit_length_cv(20.0, 4 * 19, rows=16, chunk=4, max_len=96, continuous=True)  # constant lengths: 4 waves of 19
    # 84.5 at cv 0.3
    assert cv_c == 0.0 and 0.2 < fit_length_cv(20.0, 84.5, rows=16, chunk=4, max_len=96, continuous=True) < 0.4
    # the param, as logged (MLflow strings), and runs logged before it existed (no param: chunks)
    assert continuous_of({"rollout.continuous_batching": "True"}, 16, 4) and not continuous_of({}, 16, 4)
    assert not continuous_of({"rollout.continuous_batching": "True"}, 4, 4)  # one batch: nothing waits
    assert not continuous_of({"rollout.continuous_batching": "False"}, 16, 4)


def test_fit_unknown_closed_form():
    ar, spec = ArmTime(0, 10.0, 100), ArmTime(3, 6.0, 40)
    assert fit_unknown(1.25, ar, spec, "verify_overhead_s") == pytest.approx((10 - 7.5) / 50)
    for u in ("verify_overhead_s", "step_overhead_s", "draft_overhead_s"):
        x = fit_unknown(1.25, ar, spec, u)
        assert ar.seconds(u, x) / spec.seconds(u, x) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="cannot move"):
        fit_unknown(2.5, ar, spec, "step_overhead_s")  # 2.5 * 40 = 100: both arms alike


def test_measured_hardware_file_round_trip_and_refusals(tmp_path):
    hw = MeasuredHardware(
        CostModel("curve", [1.0, 4.0], [1.0, 2.0]),
        {
            "draft_model": DrafterCost("draft_model", 1, "", curve=CostModel("curve", [1.0, 8.0], [0.1, 0.2])),
            "eagle3 k=2": DrafterCost("eagle3", 2, "", a=0.3, b=0.01),
        },
        {"machine": "x"},
    )
    back = MeasuredHardware.load(hw.save(tmp_path / "hw.json"))
    assert back.target.time(2.0) == pytest.approx(4 / 3) and back.meta == {"machine": "x"}
    assert back.drafter("draft_model", 3).step(1) == pytest.approx(0.1 * 8 / 7 + 2 * 0.1)  # d(2) + 2·d(1)
    assert back.drafter("eagle3", 2).step(2) == pytest.approx(0.32)
    with pytest.raises(ValueError, match="eagle3 k=3"):
        back.drafter("eagle3", 3)
    (tmp_path / "proj.json").write_text(json.dumps({"configs": {}, "lengths": {}}))
    with pytest.raises(ValueError, match="wb project --save-costs"):
        MeasuredHardware.load(tmp_path / "proj.json")


def test_from_cache_picks_the_matching_curves(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4})
    )
    cfg = {"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 4}
    cache = tmp_path / "cache"
    cache.mkdir()

    def entry(name, key, date, **data):
        (cache / f"{name}.json").write_text(json.dumps({"key": {"config": cfg, **key}, "date": date, **data}))

    entry("old", {"what": "forward", "rows_max": 4, "t_max": 8}, "2026-01-01", tokens=[1, 2], seconds=[9.0, 9.0])
    entry("new", {"what": "forward", "rows_max": 4, "t_max": 8}, "2026-02-01", tokens=[1, 2], seconds=[1.0, 1.0])
    entry("rows8", {"what": "forward", "rows_max": 8, "t_max": 8}, "2026-03-01", tokens=[1, 2], seconds=[5.0, 5.0])
    params = {"model.target": str(model), "drafter.kind": "ngram", "drafter.k": "2"}
    with pytest.raises(ValueError, match="no cached drafter cost for 'ngram k=2'"):
        from_cache([(params, "ngram", 2)], 4, cache)
    from workbench.perf.sweep_runs import spec_from_params

    conf = spec_from_params(params).drafter.model_dump(mode="json", exclude={"init", "online", "model"})
    entry("ng", {"what": "drafter", "rows_max": 4, "drafter": conf}, "2026-01-01", a_s=0.25, b_s=0.0)
    hw = from_cache([(params, "ngram", 2)], 4, cache)
    assert (
        hw.target.time(1) == 1.0
        and hw.drafter("ngram", 2).step(3) == 0.25
        and hw.meta["curves"]["target"]["file"] == "new.json"
    )


# ------------------------------------------------------------------ end to end through the CLI

ROWS, L, STEPS = 4, 9, 4  # one batch of 4 rows, 9 tokens each (8 after the prefill), 4 GRPO steps (1: warm-up)
TRUE_X = 1 * MS  # verify_overhead_s the "measured" speedups were made with
# 1 ms forwards, free ngram, prompt 1 token: AR = 1 + 8 = 9 ms; k accepts all: ceil(8/(k+1)) steps of 1 + x ms each
SPEEDUP = {k: 9 / (1 + -(-8 // (k + 1)) * 2) for k in (1, 2, 3)}  # 1.0, 9/7, 1.8
SEED_SCALE = {0: 1.0, 1: 1.1, 2: 0.95}


def fake_sweep(client, name, seeds=(0,), lengths=None, **extra):
    """Points none, ngram k = 1..3 at each seed; seed i's speedups scaled by SEED_SCALE[i] (the between-run scatter);
    ``lengths``: each run also logs this per-row record (ROWS rows, one prompt) at every step, as `wb run` does."""
    exp = client.create_experiment(f"wb-{name}")
    parent = log_run(client, exp, name, tags={"workbench.sweep": name, "workbench.sweep.role": "parent"})
    setting = {
        "model.target": "micro",
        "task.name": "arith_chain",
        "grpo.prompts_per_step": 1,
        "grpo.group_size": ROWS,
        "rollout.max_batch_size": 256,
        "rollout.max_new_tokens": 16,
        "measure.paired": True,
        "measure.warmup_steps": 1,
        **extra,
    }
    for (kind, k), seed in ((p, sd) for p in (("none", 0), ("ngram", 1), ("ngram", 2), ("ngram", 3)) for sd in seeds):
        m = {"timing_s/gen": [0.01] * STEPS, "timing_s/step": [0.02] * STEPS, "gen/num_tokens": [ROWS * L] * STEPS}
        if kind != "none":
            s = SPEEDUP[k] * SEED_SCALE[seed]
            m |= {
                "speedup/gen_per_step": [9.0, s / 1.01, s, s * 1.01],
                **{f"spec/acceptance_rate_pos_{i}": [1.0] * STEPS for i in range(k)},
                "spec/num_drafts": [ROWS * 8 / (k + 1)] * STEPS,
                "gen_autoregressive/num_tokens": [ROWS * L] * STEPS,
                "gen_autoregressive/num_forwards": [L - 1] * STEPS,
                "speedup/gen_modeled": [2.0] * STEPS,
            }
        rid = log_run(
            client,
            exp,
            f"{name}: {kind} k={k} seed={seed}",
            {**setting, "seed": seed, "drafter.kind": kind, "drafter.k": k or 3},
            m,
            tags={"workbench.sweep": name, "workbench.sweep.role": "point", "workbench.axis.drafter.k": str(k)},
            parent=parent,
        )
        for step in range(1, STEPS + 1) if lengths else ():
            client.log_dict(rid, lengths_record(lengths, ROWS, 16), f"completions/lengths/step_{step:05d}.json")


def flat_hardware(tmp_path):
    """A costs file: the flat target curve and ngram's drafter free at k = 1..3 (``--costs``)."""
    hw = tmp_path / "hw.json"
    MeasuredHardware(
        CostModel("curve", FLAT["tokens"], FLAT["seconds"]),
        {f"ngram k={k}": DrafterCost("ngram", k, "", a=0.0) for k in (1, 2, 3)},
    ).save(hw)
    return hw


def from_sweep(name, hw, out, *args, width=220):
    """`wb simulate --from-sweep NAME` on ``hw`` with one-token prompts, writing ``out``."""
    return runner.invoke(
        app,
        ["simulate", "--from-sweep", name, "--costs", str(hw), "--prompt-len", "1", *args, "--json", str(out)],
        terminal_width=width,
    )


def test_cli_from_sweep_predicts_and_records(store, tmp_path):
    fake_sweep(store, "cpu-k")
    hw, out = flat_hardware(tmp_path), tmp_path / "check.json"
    res = from_sweep("cpu-k", hw, out, "--calibrate-k", "3", "--draws", "2", width=200)
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert rec["fits"]["ngram"] == pytest.approx(TRUE_X, rel=1e-6) and rec["workload"]["cv"] == 0.0
    assert {r["k"]: round(r["predicted"], 4) for r in rec["rows"]} == {k: round(v, 4) for k, v in SPEEDUP.items()}
    assert rec["inside"] == rec["predicted"] == 2 and "2/2 predicted points inside" in res.output
    runs = store.search_runs([store.get_experiment_by_name("simulate").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.tags["workbench.simulate"] == "true"
    r = runs[0]
    assert r.data.params["from_sweep"] == "cpu-k" and r.data.params["unknown"] == "verify_overhead_s"
    assert [m.value for m in store.get_metric_history(r.info.run_id, "cpu/predicted")] == pytest.approx(
        list(SPEEDUP.values()), rel=1e-6
    )
    assert {a.path for a in store.list_artifacts(r.info.run_id)} == {"simulate.json", "points.json", "plot.png"}
    # the sweep's table is untouched: still its 4 points
    parent = store.search_runs(
        [store.get_experiment_by_name("wb-cpu-k").experiment_id], "tags.`workbench.sweep.role` = 'parent'"
    )[0]
    assert (
        len(store.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")) == 4
    )

    bad = runner.invoke(
        app, ["simulate", "--from-sweep", "cpu-k", "--calibrate-k", "5", "--costs", str(hw), "--prompt-len", "1"]
    )
    assert bad.exit_code == 2 and "k=5" in bad.output
    failed = [x for x in store.search_runs([r.info.experiment_id]) if x.info.status == "FAILED"]
    assert len(failed) == 1 and "k=5" in failed[0].data.tags["workbench.simulate.error"]
    quiet = runner.invoke(
        app,
        ["simulate", "--from-sweep", "cpu-k", "--costs", str(hw), "--prompt-len", "1", "--draws", "1", "--no-track"],
    )
    assert quiet.exit_code == 0 and len(store.search_runs([r.info.experiment_id])) == 2


def test_cli_from_sweep_repeats_use_the_random_effects_estimate(store, tmp_path):
    """3 seeds per point: measured [CI] is runs_ci over the seeds' per-step ratios after warm-up (wider than
    the pooled steps' CI, which ignores the 0.95-1.1 scatter between seeds), and the fit calibrates on it."""
    from workbench.stats import ratio_ci, runs_ci

    fake_sweep(store, "cpu-rep", seeds=(0, 1, 2))
    out = tmp_path / "rep.json"
    res = from_sweep("cpu-rep", flat_hardware(tmp_path), out, "--draws", "2", "--no-track")
    assert res.exit_code == 0, res.output
    rows = {r["k"]: r for r in json.loads(out.read_text())["rows"]}
    for k in (1, 2, 3):
        per_run = [[s * c / 1.01, s * c, s * c * 1.01] for s in (SPEEDUP[k],) for c in SEED_SCALE.values()]
        re, pooled = runs_ci(per_run), ratio_ci([x for r in per_run for x in r])
        assert (rows[k]["measured"], rows[k]["low"], rows[k]["high"]) == pytest.approx((re.mean, re.low, re.high))
        assert rows[k]["runs"] == 3 and rows[k]["tau"] == pytest.approx(re.tau) and rows[k]["tau"] > 0
        assert rows[k]["high"] - rows[k]["low"] > 2 * (pooled.high - pooled.low)
    assert rows[3]["predicted"] == pytest.approx(rows[3]["measured"], rel=1e-9)  # calibrated on the random-effects mean


def test_cli_from_sweep_reads_continuous_batching(store, tmp_path):
    """A sweep logged with rollout.continuous_batching=True and more rows (4) than slots (2) is simulated in slots."""
    fake_sweep(store, "cpu-cb", **{"rollout.continuous_batching": True, "rollout.max_batch_size": 2})
    out = tmp_path / "cb.json"
    res = from_sweep("cpu-cb", flat_hardware(tmp_path), out, "--draws", "1", "--no-track")
    assert res.exit_code == 0, res.output
    assert (
        json.loads(out.read_text())["workload"]["continuous"] is True
        and "batched continuously in 2 slots" in res.output
    )


def test_cli_from_sweep_uses_the_logged_lengths(store, tmp_path):
    """Runs that logged their per-row lengths are simulated on those (drawn whole), not on the lognormal fit;
    here the logged rows are the L = 9 tokens the counts say, so the predictions are the hand values."""
    fake_sweep(store, "cpu-len", lengths=[L] * ROWS)
    out = tmp_path / "len.json"
    res = from_sweep("cpu-len", flat_hardware(tmp_path), out, "--draws", "2", "--no-track")
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert rec["workload"]["lengths"].startswith("measured: 16 steps x 4 rows") and "measured: 16 steps" in res.output
    assert {r["k"]: round(r["predicted"], 4) for r in rec["rows"]} == {k: round(v, 4) for k, v in SPEEDUP.items()}
    base_ar = rec["rows"][0]["gen_ar_s"]
    # logged rows longer than the counts (13 tokens): the simulation decodes those, 12 forwards a row instead of 8
    fake_sweep(store, "cpu-len-long", lengths=[L + 4] * ROWS)
    res = from_sweep("cpu-len-long", flat_hardware(tmp_path), out, "--draws", "2", "--no-track")
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert rec["workload"]["mean_len"] == L + 4 and rec["rows"][0]["gen_ar_s"] == pytest.approx(base_ar + 4 * MS)


def test_from_sweep_refuses_lengths_of_another_batch_and_says_why_it_fits(store, tmp_path):
    from workbench.cli.simulate_sweep import measured_sweep
    from workbench.perf.simulate.from_sweep import read_sweep
    from workbench.report.target import resolve

    fake_sweep(store, "cpu-len-bad", lengths=[L] * (2 * ROWS))  # 8 rows logged for a 4-row step
    with pytest.raises(ValueError, match=r"holds 8 lengths, the sweep's steps 4 rows"):
        read_sweep(measured_sweep(resolve("cpu-len-bad", store.tracking_uri)), prompt_len=1)
    fake_sweep(store, "cpu-len-none")  # runs from before lengths were logged: the fit, and why
    wl = read_sweep(measured_sweep(resolve("cpu-len-none", store.tracking_uri)), prompt_len=1)
    assert wl.measured is None and "logged no completion lengths" in wl.lengths_note
