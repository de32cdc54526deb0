"""wb simulate through the CLI, and the 8B validation against docs/design.md §6 (calibrated on one point)."""

import json

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.perf.simulate import load_scenario, run
from workbench.perf.simulate.scenario import validate

runner = CliRunner()

TINY = """
name: tiny
model: {preset: qwen3-8b}
hardware: {preset: h100-sxm}
cluster: {gpus: 2}
workload: {prompts: 4, group_size: 2, prompt_len: 10, response: {mean: 60, cv: 0.5, max: 120}}
speculation: {drafter: eagle3, alpha: 0.7, k: 2, k_scan: [1, 2, 3]}
reference: {gen_ar: 1.0}
"""


def test_cli_sweep_json_plot(store, tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    res = runner.invoke(
        app,
        [
            "simulate",
            str(p),
            "hardware.preset=gb200",
            "--sweep",
            "k=1,2",
            "gpus=2,4",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
    )
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert len(rec["rows"]) == 4 and {r["point"]["speculation.k"] for r in rec["rows"]} == {"1", "2"}
    assert rec["rows"][0]["reference"]["gen_ar"]["reference"] == 1.0
    assert png.stat().st_size > 1000
    # the MLflow record: one run in experiment "simulate", tagged, the scenario's fields as params, a metric per grid
    # row
    runs = store.search_runs([store.get_experiment_by_name("simulate").experiment_id])
    assert (
        len(runs) == 1
        and runs[0].info.status == "FINISHED"
        and runs[0].data.tags["workbench.simulate.kind"] == "scenario"
    )
    r = runs[0]
    assert r.data.params["workload.prompts"] == "4" and r.data.params["hardware.preset"] == "gb200"
    assert r.data.params["simulate.sweep"] == "k=1,2 gpus=2,4"
    hist = store.get_metric_history(r.info.run_id, "simulate/gen_speedup")
    assert [m.step for m in hist] == [0, 1, 2, 3] and [m.value for m in hist] == pytest.approx(
        [x["gen_speedup"] for x in rec["rows"]]
    )
    assert {a.path for a in store.list_artifacts(r.info.run_id)} == {"simulate.json", "points.json", "out.png"}


def test_cli_failed_simulate_is_marked_failed(store, tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY + "calibration: {unknown: flops_efficiency, gen_s: 1.0e-9}\n")  # no efficiency <= 1 is that fast
    res = runner.invoke(app, ["simulate", str(p)])
    assert res.exit_code == 2 and "calibration" in res.output
    (r,) = store.search_runs([store.get_experiment_by_name("simulate").experiment_id])
    assert r.info.status == "FAILED" and "calibration" in r.data.tags["workbench.simulate.error"]
    assert runner.invoke(app, ["simulate", str(p), "--no-track"]).exit_code == 2
    assert len(store.search_runs([r.info.experiment_id])) == 1


def test_cli_bad_key_exits_2(store, tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    res = runner.invoke(app, ["simulate", str(p), "gen.tpp=2"])
    assert res.exit_code == 2 and "Did you mean 'gen.tp'" in res.output


# docs/design.md §6 via experiments/scenarios/qwen3-8b-gb200.yaml (EAGLE-3's published acceptance per k, #33):
# flops_efficiency calibrated on RL-Zero's speculative gen at k = 3 (56.6 s); the rest predicted. RL-Think's
# speculative gen is the known miss (-17 %, docs/results/simulate-gb200.md): these bands fail if it closes too,
# so the write-up gets updated. The exact numbers: tests/test_simulate_golden.py.


@pytest.fixture(scope="module")
def rows_8b():
    raw, sc = load_scenario("qwen3-8b-gb200", ["speculation.k_scan=[3,5,7]"])
    raw = {**raw, "variants": {v: raw["variants"][v] for v in ("RL-Zero", "RL-Think")}}
    return run(raw, validate(raw))


def test_8b_stage_times(rows_8b):
    fit, rows = rows_8b
    assert fit.key == "hardware.flops_efficiency" and 0.1 < fit.value < 0.6
    by = {r.variant: r.errors for r in rows}
    assert set(by["RL-Zero"]) == {
        "gen_ar",
        "step_ar",
        "gen_spec",
        "step_spec",
        "gen_speedup",
        "gen_speedup_k5",
        "gen_speedup_k7",
    }
    for name in ("gen_ar", "step_ar", "gen_spec", "step_spec"):
        assert abs(by["RL-Zero"][name][2]) <= 0.10, name
    for name in ("gen_ar", "step_ar"):
        assert abs(by["RL-Think"][name][2]) <= 0.10, name
    assert -0.20 < by["RL-Think"]["gen_spec"][2] < -0.10  # the known miss: RL-Think's speedup is over-predicted


def test_8b_longer_k_loses_but_less_than_published(rows_8b):
    _, rows = rows_8b
    for r in rows:
        by_k = r.result.gen_speedup_by_k
        assert by_k[7] < by_k[5] < by_k[3]
        assert r.errors["gen_speedup_k5"][2] > 0.15 and r.errors["gen_speedup_k7"][2] > 0.15  # the flat k-curve (#33)
