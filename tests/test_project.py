"""`wb project` (workbench.perf): Leviathan formulas, roofline, the published seeds (docs/design.md §6), async overlap,
CLI."""

import json

import pytest
from typer.testing import CliRunner

from workbench import perf as pm
from workbench.perf import seeds as sd


def test_leviathan_values():
    assert pm.expected_tokens(0.8, 3) == pytest.approx((1 - 0.8**4) / 0.2)  # 2.952
    assert pm.expected_tokens(0.0, 5) == 1.0 and pm.expected_tokens(1.0, 4) == 5.0
    assert pm.gen_speedup(0.8, 3, 0.05) == pytest.approx(2.952 / 1.15, rel=1e-4)
    # speculation pays for some k iff α > c (docs/design.md §4): k = 1 speedup (1 + α) / (1 + c)
    assert pm.gen_speedup(0.3, 1, 0.4) < 1 < pm.gen_speedup(0.5, 1, 0.4)
    assert pm.step_speedup(150.0, 100.0, 2.0) == pytest.approx(150 / 100)


def test_alpha_estimates():
    assert pm.alpha_from_per_position([0.7, 0.49, 0.343]) == pytest.approx(0.7)
    assert pm.alpha_from_acceptance_length(pm.expected_tokens(0.65, 4), 4) == pytest.approx(0.65, abs=1e-6)


def test_roofline_and_curve(tmp_path):
    # 8B params bf16 on H100: weights 16 GB / 3.35 TB/s = 4.78 ms; compute-bound above ~148 tokens
    t1 = pm.roofline_time(8e9, 1, 989e12, 3.35e12)
    assert t1 == pytest.approx(16e9 / 3.35e12)
    assert pm.roofline_time(8e9, 4096, 989e12, 3.35e12) == pytest.approx(2 * 8e9 * 4096 / 989e12)
    roof = pm.CostModel("roofline", params=8e9, flops=989e12, bandwidth=3.35e12)
    assert roof.verify_ratio(3, 8) == 1.0  # 32 tokens: memory-bound
    assert roof.verify_ratio(3, 1024) == pytest.approx(4.0)  # fully compute-bound: (k+1)x
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"tokens": [1, 100, 200], "seconds": [1.0, 1.0, 2.0]}))
    cur = pm.load_cost_curve(f)
    assert cur.time(50) == 1.0 and cur.time(150) == 1.5 and cur.time(300) == pytest.approx(3.0)
    g = tmp_path / "c.csv"
    g.write_text("tokens,seconds\n1,1\n100,1\n200,2\n")
    assert pm.load_cost_curve(g).verify_ratio(1, 100) == 2.0


def test_seeds_projected_from_published_stage_times():
    """docs/design.md §6: the step speedup the model projects from the autoregressive stage times and the
    gen speedup (non-gen stages unchanged) is within 2 % of the published 1.35× / 1.41×."""
    rows = {r.name: r for r in pm.seeds_check()}
    think, zero = rows["RL-Think"], rows["RL-Zero"]
    # RL-Think: step 185.3 s, gen 133.6 -> 87.0 s: 185.3 / (185.3 - 133.6 + 87.0) = 185.3 / 138.7
    assert think.step == pytest.approx(185.3) and think.projected == pytest.approx(185.3 / 138.7)
    # RL-Zero: step 151.2 s, gen 100.0 -> 56.6 s: 151.2 / 107.8
    assert zero.step == pytest.approx(151.2) and zero.projected == pytest.approx(151.2 / 107.8)
    assert think.error == pytest.approx(1.3360 / 1.35 - 1, abs=1e-3) and zero.error == pytest.approx(
        1.4026 / 1.41 - 1, abs=1e-3
    )
    for r in (think, zero):
        assert r.checks == {
            "totals": True,
            "gen speedup": True,
            "gen fraction": True,
            "logprob+train fraction": True,
            "step speedup": True,
        }, r.name
        assert abs(r.projected / r.seed.step_speedup - 1) <= sd.STEP_SPEEDUP_TOLERANCE == 0.02
        # the projection is not the published speculative total: it keeps the autoregressive non-gen
        # stages, so it misses the published step by exactly the non-gen drift the data show
        proj_step = r.step - r.seed.autoregressive["gen"] + r.seed.speculative["gen"]
        assert proj_step - r.step_spec == pytest.approx(r.non_gen[0] - r.non_gen[1])
    assert think.gen_fraction == pytest.approx(0.721, abs=1e-3) and zero.gen_fraction == pytest.approx(0.661, abs=1e-3)
    assert think.drift() == pytest.approx({"data": -0.1, "prepare": -0.5, "logprob": 0.2, "train": -0.9})
    assert zero.gen_speedup == pytest.approx(1.767, abs=1e-3)  # published 1.8: one decimal


def test_seeds_check_fails_on_a_wrong_step_model(monkeypatch):
    """The check can fail: a step model that drops a stage or uses the speculative gen in both arms
    misses the published speedups or totals."""
    from workbench.perf.analytic import step_speedup

    def drop_train(stages):
        return sum(v for k, v in stages.items() if k != "train")

    monkeypatch.setattr(sd, "sync_step", drop_train)
    assert not any(r.ok for r in sd.seeds_check())
    assert all(not r.checks["totals"] and not r.checks["step speedup"] for r in sd.seeds_check())
    monkeypatch.undo()
    # a step that speeds up like its gen stage (the non-gen stages forgotten): 1.54x / 1.77x, +14 % / +25 %
    monkeypatch.setattr(sd, "step_speedup", lambda step, gen, s: s)
    assert all(r.error > 0.1 and not r.checks["step speedup"] and r.checks["totals"] for r in sd.seeds_check())
    monkeypatch.setattr(sd, "step_speedup", step_speedup)
    # a published seed whose total disagrees with its stages, or whose speedup the model misses
    bad = sd.PublishedSeed(
        "x", {"gen": 100.0, "train": 50.0}, {"gen": 50.0, "train": 50.0}, (160.0, 100.0), 1.6, 0.005, 2.0, 0.005
    )
    r = sd.check_seed(bad)
    assert not r.checks["totals"] and not r.checks["step speedup"] and r.checks["gen speedup"]
    assert r.projected == pytest.approx(1.5) and sd.check_seed(bad, tolerance=0.5).checks["step speedup"]


def test_async_overlap_monotonic():
    gen, rest = 100.0, 50.0
    assert pm.async_step_time(gen, rest, 0) == pytest.approx(150.0)
    assert pm.async_step_time(gen, rest, 1) == pytest.approx(100.0, rel=1e-3)  # max(gen, train side)
    times = [pm.async_step_time(gen, rest, s, cv=0.4, steps=2000) for s in range(0, 5)]
    assert all(a >= b - 1e-9 for a, b in zip(times, times[1:]))
    assert times[0] > times[1] > times[-1] >= gen - 1e-6
    # speculation helps async only while gen is the longer stage
    assert pm.async_step_time(40.0, rest, 1) == pytest.approx(rest, rel=1e-3)


def test_best_k_and_project():
    rows = pm.project(
        {"gen": 100, "logprob": 20, "train": 15},
        {"d": 0.8},
        {"d": 0.05},
        list(range(1, 9)),
        pm.CostModel("roofline", params=8e9, flops=989e12, bandwidth=3.35e12),
        batch=64,
    )
    best = pm.best_per_drafter(rows)["d"]
    assert 2 <= best.k <= 5 and best.gen_speedup == max(r.gen_speedup for r in rows)


def test_cli_project():
    from workbench.cli import app

    r = CliRunner().invoke(
        app,
        ["project", "--gen", "100", "--logprob", "20", "--train", "15", "--alpha", "0.8", "--c", "0.05", "--k", "1..5"],
    )
    assert r.exit_code == 0, r.output
    assert "best k" in r.output and "staleness" in r.output
    r = CliRunner().invoke(app, ["project", "--seeds"])
    assert r.exit_code == 0, r.output
    assert "RL-Zero" in r.output and "1.403" in r.output and "1.336" in r.output and "1.41" in r.output
    assert "pass" in r.output and "FAIL" not in r.output and "72.1%" in r.output
    r = CliRunner().invoke(app, ["project", "--alpha", "0.8"])
    assert r.exit_code == 2


def test_stages_and_alpha_from_mlflow(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("proj")
    with mlflow.start_run(run_name="r1") as run:
        mlflow.log_params({"drafter.kind": "draft_model", "drafter.k": 3})
        for step, gen in [(1, 99.0), (2, 10.0), (3, 12.0)]:  # step 1 is warm-up: excluded
            mlflow.log_metrics(
                {
                    "timing_s/gen": gen,
                    "timing_s/train": 4.0,
                    "spec/acceptance_rate_pos_0": 0.8,
                    "spec/acceptance_rate_pos_1": 0.64,
                    "spec/acceptance_rate_pos_2": 0.512,
                },
                step=step,
            )
    mlflow.set_tracking_uri(None)
    stages, info = pm.stages_from_mlflow("r1", uri)
    assert stages == {"gen": 11.0, "train": 4.0}
    assert info["drafter"] == "draft_model" and pm.alpha_from_per_position(info["per_pos"]) == pytest.approx(0.8)
    assert pm.stages_from_mlflow(run.info.run_id, uri)[0]["gen"] == 11.0
    from workbench.cli import app

    r = CliRunner().invoke(app, ["project", "--run", "r1", "--tracking-uri", uri, "--k", "2,3"])
    assert r.exit_code == 0, r.output
    assert "draft_model" in r.output

    # --async-run: the async model's gen and train side from a run on each side's share of the machine
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_name="shared"):
        for step in (1, 2, 3):
            mlflow.log_metrics({"timing_s/gen": 20.0, "timing_s/train": 8.0}, step=step)
    mlflow.set_tracking_uri(None)
    r = CliRunner().invoke(
        app,
        [
            "project",
            "--run",
            "r1",
            "--async-run",
            "shared",
            "--tracking-uri",
            uri,
            "--k",
            "3",
            "--staleness",
            "1",
            "--cv",
            "0",
        ],
        terminal_width=300,
    )
    assert r.exit_code == 0, r.output
    assert "shared cores" in r.output and "gen 20.00 s ‖ train side 8.00 s" in r.output
    assert "20.00 (0.75×)" in r.output  # staleness 1: max(20, 8) s against the synchronous 11 + 4 s
    r = CliRunner().invoke(app, ["project", "--run", "r1", "--async-run", "nope", "--tracking-uri", uri])
    assert r.exit_code == 2 and "--async-run" in r.output


@pytest.mark.parametrize(
    "args,option",
    [
        (["--gen", "10", "--batch", "0"], "--batch"),
        (["--gen", "10", "--train", "-1"], "--train"),
        (["--gen", "10", "--bandwidth", "0"], "--bandwidth"),
    ],
)
def test_project_rejects_out_of_range_options(args, option):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["project", *args])
    assert res.exit_code == 2 and option in res.output


# ------------------------------------- step counts (workbench.perf.steps), wb project --sweep (an alias)


def test_tokens_per_step_and_emit_distribution():
    rates = [0.8, 0.6, 0.3]  # P(draft position i accepted); accepts are a prefix
    assert pm.tokens_per_step(rates) == pytest.approx(2.7)
    p = pm.emit_pmf(rates)  # P(emit 1..4 tokens) = 1-0.8, 0.8-0.6, 0.6-0.3, 0.3
    assert p == pytest.approx([0.2, 0.2, 0.3, 0.3])
    assert sum((j + 1) * q for j, q in enumerate(p)) == pytest.approx(pm.tokens_per_step(rates))
    # 20 % of row-steps without a draft emit one token: 0.2·1 + 0.8·1.5 = 1.4 tokens per row-step
    q = pm.emit_pmf([0.5], no_draft=0.2)
    assert q == pytest.approx([0.6, 0.4]) and q @ [1, 2] == pytest.approx(1.4)
    assert pm.emit_pmf([0.5, 0.7]) == pytest.approx([0.5, 0.0, 0.5])  # noisy non-monotone rates are clipped
    # E[N] from the rates directly differs from the geometric-α fit when acceptance is not geometric
    assert pm.tokens_per_step([0.8, 0.66, 0.5]) != pytest.approx(
        pm.expected_tokens(pm.alpha_from_per_position([0.8, 0.66, 0.5]), 3), abs=0.01
    )


def test_simulated_steps_with_shrinking_batch():
    # autoregressive: the prefill emits the first token, then one per step; finished rows leave
    assert pm.simulate_steps([5, 3, 1], [1.0]) == (4.0, 6.0)
    assert pm.simulate_steps([5, 3], [0.0, 1.0]) == (2.0, 3.0)  # always 2 tokens: 4 -> 2 steps, 2 -> 1 step
    assert pm.simulate_steps([5], [0.0, 0.0, 1.0]) == (2.0, 2.0)  # 3 tokens per step, 4 needed
    assert pm.batch_steps([[5, 3, 5, 3]], 2, [1.0]) == (8.0, 12.0)  # two chunks of 2 rows run one after the other
    # random acceptance: row-steps ≈ tokens / E[N]; the batch waits for its slowest row (S > max / E[N])
    lengths = [41] * 32
    S, R = pm.simulate_steps(lengths, pm.emit_pmf([0.8, 0.6, 0.3]), reps=64, seed=0)
    assert R / 32 == pytest.approx(40 / 2.7, rel=0.06)
    assert S > 40 / 2.7 + 2 and S == pm.simulate_steps(lengths, pm.emit_pmf([0.8, 0.6, 0.3]), reps=64, seed=0)[0]


def test_fit_affine():
    assert pm.fit_affine([1, 2, 4], [0.003, 0.005, 0.009]) == pytest.approx((0.001, 0.002))
    a, b = pm.fit_affine([1, 2, 3], [0.0, 0.3, 0.5])  # negative intercept -> through the origin
    assert a == 0.0 and b == pytest.approx(2.1 / 14)


def test_row_steps_from_the_counters():
    """64 rows of 33 tokens (1 from the prefill): the baseline's 2048 row-steps; a k=2 point accepting
    [1, 0] (2 tokens a step) 1024 drafted ones; an n-gram point's undrafted row-steps from the token count."""
    from workbench.perf.simulate.from_sweep import row_steps_of

    shape = {"grpo.prompts_per_step": "8", "grpo.group_size": "8"}
    run = lambda kind, k, means: pm.SweepRun(  # noqa: E731
        "r", kind, "FINISHED", shape | {"drafter.kind": kind, "drafter.k": str(k)}, means
    )
    assert row_steps_of(run("none", 0, {"gen/num_tokens": 2112.0})) == (2048.0, 1.0)
    point = {
        "gen/num_tokens": 2112.0,
        "spec/num_drafts": 1024.0,
        "spec/acceptance_rate_pos_0": 1.0,
        "spec/acceptance_rate_pos_1": 0.0,
    }
    assert row_steps_of(run("draft_model", 2, point)) == (1024.0, 0.0)
    R, f0 = row_steps_of(run("ngram", 1, {**point, "spec/num_drafts": 600.0, "spec/acceptance_rate_pos_0": 0.5}))
    assert R == pytest.approx(600 + (2048 - 600 * 1.5)) and f0 == pytest.approx(1148 / 1748)


def test_project_sweep_is_an_alias_of_simulate_from_sweep(monkeypatch):
    """`wb project --sweep NAME` runs the one model-vs-sweep check (`wb simulate --from-sweep NAME`, its defaults)
    with a one-line note; the retired step-speedup check's options are refused naming the survivor."""
    from workbench.cli import app, simulate_sweep

    calls = []
    monkeypatch.setattr(simulate_sweep, "sweep_check", lambda *a: calls.append(a))
    res = CliRunner().invoke(app, ["project", "--sweep", "fake", "--tracking-uri", "sqlite:///x.db"])
    assert res.exit_code == 0, res.output
    assert "wb simulate --from-sweep fake" in res.output
    ((name, calibrate_k, unknown, *_, track),) = calls
    assert (name, calibrate_k, unknown, track["tracking_uri"]) == ("fake", 3, "verify_overhead_s", "sqlite:///x.db")
    for extra in (["--costs", "c.json"], ["--load-adjust"], ["--threads", "2"]):
        res = CliRunner().invoke(app, ["project", "--sweep", "fake", *extra])
        assert res.exit_code == 2 and "wb simulate --from-sweep" in res.output


def test_stages_read_through_workbench_runs(store):
    """Means after the run's measure.warmup_steps (``skip_first=False``: every step)."""
    from test_runs import log_run

    uri = store.tracking_uri
    exp = store.create_experiment("workbench")
    parent = log_run(store, exp, "w", tags={"workbench.sweep": "w", "workbench.sweep.role": "parent"})
    common = {"model.target": "tiny", "grpo.group_size": "8", "measure.warmup_steps": "2"}
    for name, params, status in [
        ("base", {"drafter.kind": "none", "measure.paired": "false"}, "FINISHED"),
        ("base-g4", {"drafter.kind": "none", "grpo.group_size": "4"}, "FAILED"),
        ("p", {"drafter.kind": "ngram", "drafter.k": "2", "measure.paired": "true"}, "FINISHED"),
        ("p-g4", {"drafter.kind": "ngram", "drafter.k": "2", "grpo.group_size": "4"}, "FINISHED"),
    ]:
        log_run(
            store,
            exp,
            name,
            common | params,
            {"timing_s/gen": [50.0, 40.0, 2.0, 4.0], "spec/acceptance_length": [9, 9, 2, 2]},
            status,
            tags={"workbench.sweep.point": name},
            parent=parent,
        )
    assert pm.stages_from_mlflow("p", uri)[0] == {"gen": 3.0}
    assert pm.stages_from_mlflow("p", uri, skip_first=False)[0] == {"gen": 24.0}
    with pytest.raises(ValueError, match="--run: no MLflow run with id or name 'nope'"):
        pm.stages_from_mlflow("nope", uri)


def test_the_analytic_model_is_wb_simulate_and_wb_project_prints_it():
    """`wb simulate` from stage times is what `wb project` did; the old command names its new form and runs it."""
    from workbench.cli import app
    from workbench.cli.project import simulate_args

    args = ["--gen", "100", "--alpha", "0.8", "--c", "0.05", "--k", "1..3"]
    new = CliRunner().invoke(app, ["simulate", *args], terminal_width=200)
    old = CliRunner().invoke(app, ["project", *args], terminal_width=200)
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert "best k" in new.output and old.output.endswith(new.output)  # the same projection, after the note
    assert "note: `wb project` is now `wb simulate`: wb simulate --gen 100" in old.output
    assert simulate_args(["--run", "r", "--seeds", "--sweep=s", "--k", "3"]) == [
        "--from-run", "r", "--published", "--from-sweep=s", "--k", "3",
    ]  # fmt: skip
    assert CliRunner().invoke(app, ["simulate", "--published"]).exit_code == 0


@pytest.mark.parametrize(
    "args, says",
    [
        (["qwen3-8b-gb200", "--gen", "10"], "give no scenario or --from-sweep"),
        (["qwen3-8b-gb200", "--k", "3", "--no-track"], "a scenario takes k=1..7 as an argument"),
        (["--calibrate", "--k", "1,2", "--gen-speedup", "1.2"], "one integer with --k"),
        ([], "stage times (--gen SECONDS or --from-run RUN)"),
    ],
)
def test_wb_simulate_keeps_its_modes_apart(args, says):
    from workbench.cli import app

    res = CliRunner().invoke(app, ["simulate", *args], terminal_width=200)
    assert res.exit_code == 2 and says in res.output, res.output
