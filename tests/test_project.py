"""`wb project`: Leviathan formulas, roofline, the published seeds (DESIGN.md §6), async overlap, CLI."""

import json

import pytest
from typer.testing import CliRunner

from workbench import project as pm


def test_leviathan_values():
    assert pm.expected_tokens(0.8, 3) == pytest.approx((1 - 0.8**4) / 0.2)  # 2.952
    assert pm.expected_tokens(0.0, 5) == 1.0 and pm.expected_tokens(1.0, 4) == 5.0
    assert pm.gen_speedup(0.8, 3, 0.05) == pytest.approx(2.952 / 1.15, rel=1e-4)
    # speculation pays for some k iff α > c (DESIGN.md §4): k = 1 speedup (1 + α) / (1 + c)
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


def test_seeds_reproduced_within_002():
    rows = {r["seed"]: r for r in pm.seeds_check()}
    # RL-Zero: gen 100.0 s -> 56.6 s, step 1.41x; RL-Think: 133.6 s -> 87.0 s, step 1.35x (DESIGN.md §6)
    assert rows["RL-Zero"]["step_speedup"] == pytest.approx(1.41, abs=0.02)
    assert rows["RL-Think"]["step_speedup"] == pytest.approx(1.35, abs=0.02)
    assert rows["RL-Zero"]["step_speedup_in_range"] == pytest.approx(1.41, abs=0.02)
    assert rows["RL-Think"]["step_speedup_in_range"] == pytest.approx(1.35, abs=0.02)
    assert 0.65 <= rows["RL-Zero"]["gen_fraction"] <= 0.72
    assert rows["RL-Zero"]["gen_speedup"] == pytest.approx(1.8, abs=0.05)
    assert rows["RL-Think"]["gen_speedup"] == pytest.approx(1.54, abs=0.01)
    # from stage times alone: project() with the backed-out non-gen time and S = gen / spec gen
    z = rows["RL-Zero"]
    alpha = pm.alpha_from_acceptance_length(z["gen_speedup"], 1)  # k=1, c=0, memory-bound: S = 1 + α
    [p] = pm.project({"gen": 100.0, "other": z["non_gen_s"]}, {"eagle3": alpha}, {"eagle3": 0.0}, [1])
    assert p.step_speedup == pytest.approx(1.41, abs=0.02) and p.gen_s == pytest.approx(56.6, abs=0.05)


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
    rows = pm.project({"gen": 100, "logprob": 20, "train": 15}, {"d": 0.8}, {"d": 0.05}, list(range(1, 9)),
                      pm.CostModel("roofline", params=8e9, flops=989e12, bandwidth=3.35e12), batch=64)
    best = pm.best_k(rows)["d"]
    assert 2 <= best.k <= 5 and best.gen_speedup == max(r.gen_speedup for r in rows)


def test_cli_project():
    from workbench.cli import app

    r = CliRunner().invoke(app, ["project", "--gen", "100", "--logprob", "20", "--train", "15", "--alpha", "0.8", "--c", "0.05", "--k", "1..5"])
    assert r.exit_code == 0, r.output
    assert "best k" in r.output and "staleness" in r.output
    r = CliRunner().invoke(app, ["project", "--seeds"])
    assert r.exit_code == 0, r.output
    assert "RL-Zero" in r.output and "1.410" in r.output
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
            mlflow.log_metrics({"timing_s/gen": gen, "timing_s/train": 4.0, "spec/acceptance_rate_pos_0": 0.8,
                                "spec/acceptance_rate_pos_1": 0.64, "spec/acceptance_rate_pos_2": 0.512}, step=step)
    mlflow.set_tracking_uri(None)
    stages, info = pm.stages_from_mlflow("r1", uri)
    assert stages == {"gen": 11.0, "train": 4.0}
    assert info["drafter"] == "draft_model" and pm.alpha_from_per_position(info["per_pos"]) == pytest.approx(0.8)
    assert pm.stages_from_mlflow(run.info.run_id, uri)[0]["gen"] == 11.0
    from workbench.cli import app

    r = CliRunner().invoke(app, ["project", "--run", "r1", "--tracking-uri", uri, "--k", "2,3"])
    assert r.exit_code == 0, r.output
    assert "draft_model" in r.output


@pytest.mark.parametrize("args,option", [
    (["--gen", "10", "--batch", "0"], "--batch"),
    (["--gen", "10", "--train", "-1"], "--train"),
    (["--gen", "10", "--bandwidth", "0"], "--bandwidth"),
])
def test_project_rejects_out_of_range_options(args, option):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["project", *args])
    assert res.exit_code == 2 and option in res.output
