"""Golden tests of benchmarks/simulate-gb200.{json,md} (#33): a fresh run reproduces the committed numbers,
and the write-up's generated tables are the committed JSON rendered. Regenerate both with
`python benchmarks/simulate_gb200.py` when the model changes on purpose."""

import json
from pathlib import Path

import pytest

from workbench.perf.simulate import load_scenario, run
from workbench.perf.simulate.validate import holdout
from workbench.perf.simulate.writeup import GRID_235B, SCENARIO_8B, SCENARIO_235B, apply, render

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
REL = 1e-6  # deterministic arithmetic (seeded draws): only float noise may differ


@pytest.fixture(scope="module")
def committed():
    return json.loads((BENCH / "simulate-gb200.json").read_text())


def test_writeup_is_the_committed_json_rendered(committed):
    md = (BENCH.parent / "docs" / "results" / "simulate-gb200.md").read_text()
    assert apply(md, render(committed)) == md


@pytest.fixture(scope="module")
def fresh_8b():
    raw, base = load_scenario(SCENARIO_8B, ["speculation.k_scan=[3,5,7]"])
    raw = {**raw, "variants": {v: raw["variants"][v] for v in ("RL-Zero", "RL-Think")}}
    return holdout(raw, base, "RL-Zero", 3)


def test_8b_headline_numbers(committed, fresh_8b):
    gold = committed["8b"]["directions"]["RL-Zero k=3"]
    assert fresh_8b.fit.value == pytest.approx(gold["fit"]["value"], rel=1e-3)  # the solver's tolerance
    rows = {r["variant"]: r for r in gold["rows"]}
    for r in fresh_8b.rows:
        g = rows[r.variant]
        for name in ("gen_ar", "gen_spec", "step_ar", "step_spec"):
            assert getattr(r.result, name) == pytest.approx(g[name], rel=1e-3), (r.variant, name)
        for k in (3, 5, 7):
            assert r.result.gen_speedup_by_k[k] == pytest.approx(g["gen_speedup_by_k"][str(k)], rel=1e-3), (
                r.variant,
                k,
            )


def test_8b_committed_verdict(committed):
    """The committed misses the write-up states (so a change that moves them fails here first)."""
    t = {(r["variant"], r["quantity"], r["k"]): r for r in committed["8b"]["directions"]["RL-Zero k=3"]["table"]}
    assert t[("RL-Zero", "gen_spec", 3)]["role"] == "calibrated" and abs(t[("RL-Zero", "gen_spec", 3)]["error"]) < 1e-3
    assert t[("RL-Think", "gen_spec", 3)]["error"] < -0.10  # RL-Think k = 3 outside 10 %
    for v in ("RL-Zero", "RL-Think"):
        for k in (5, 7):
            assert t[(v, "gen_speedup", k)]["error"] > 0.15  # the flat k curve
    assert t[("RL-Think", "gen_speedup", 5)]["predicted"] > 1.0  # not below plain decoding
    for v in ("RL-Zero n-gram", "RL-Think n-gram"):
        assert t[(v, "gen_speedup", 3)]["predicted"] > 1.0  # n-gram not slower than plain decoding


@pytest.mark.slow  # ~25 s on the 2-core CPU (docs/testing.md): one point of the committed grid, its largest cluster
def test_235b_headline_numbers(committed):
    raw, base = load_scenario(SCENARIO_235B)
    _, rows = run(raw, base, ["gpus=2048", "staleness=1", "k=5"])
    gold = {(r["gpus"], r["staleness"], r["k"]): r for r in committed["235b"]["rows"]}
    assert committed["235b"]["grid"] == GRID_235B
    assert len(rows) == 1 and (rows[0].result.gpus, rows[0].result.staleness, rows[0].result.k) in gold
    for r in rows:
        g = gold[(r.result.gpus, r.result.staleness, r.result.k)]
        for name in ("gen_speedup", "step_speedup", "e2e_speedup"):
            assert getattr(r.result, name) == pytest.approx(g[name], rel=REL), name
