"""wb bench: the maths of the performance model, and the structure of a tiny real benchmark
(values are measured, never asserted)."""

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from workbench.bench import batch_predicted_speedup, expected_tokens, fit_alpha, predicted_speedup
from workbench.cli import app


def test_expected_tokens_matches_leviathan():
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_fit_alpha_recovers_geometric_rates():
    assert fit_alpha([0.8, 0.64, 0.512]) == pytest.approx(0.8)
    assert fit_alpha([0.0, 0.0]) is None


def test_predicted_speedup():
    # alpha 0.8, k 3, c 0.1, verification as costly as one step: E[N] = 2.952, cost 1.3.
    assert predicted_speedup(0.8, 3, 0.1, 1.0) == pytest.approx(2.952 / 1.3)


def test_batch_prediction_counts_the_slowest_row():
    B, M, k, c, v = 16, 64, 3, 0.2, 1.5
    # every draft accepted: each step emits k+1 tokens, so ceil(63 / 4) = 16 steps for every row
    full = SimpleNamespace(num_drafts=B * 16, num_generated_tokens=B * M)
    assert batch_predicted_speedup(full, [1.0, 1.0, 1.0], B, M, k, c, v) == pytest.approx(63 / (16 * (k * c + v)))
    # partial acceptance: the batch waits for its slowest row, below the per-row E[N] / step cost
    rates = [0.7, 0.5, 0.35]
    en = 1 + sum(rates)
    part = SimpleNamespace(num_drafts=round(B * 63 / en), num_generated_tokens=B * M)
    batch = batch_predicted_speedup(part, rates, B, M, k, c, v)
    assert batch < en / (k * c + v)
    one = SimpleNamespace(num_drafts=round(63 / en), num_generated_tokens=M)
    assert batch_predicted_speedup(one, rates, 1, M, k, c, v) > batch  # one row: no straggler to wait for
    # rows without a draft (n-gram misses) emit one token and lower the prediction further
    misses = SimpleNamespace(num_drafts=part.num_drafts // 2, num_generated_tokens=B * M)
    assert batch_predicted_speedup(misses, rates, B, M, k, c, v) < batch


def test_wb_bench_writes_results(tmp_path):
    res = CliRunner().invoke(app, [
        "bench", "micro", "--batch-sizes", "1,2", "--k", "1,2", "--max-new-tokens", "6", "--repeats", "1",
        "--model-batch", "2", "--out", str(tmp_path), "--name", "b", "--drafters", "draft_model,ngram,eagle3",
    ])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "b.json").read_text())
    assert [x["batch"] for x in r["ar"]] == [1, 2]
    assert all(x["ours_tok_s"] > 0 and x["hf_generate_tok_s"] > 0 for x in r["ar"])
    assert [x["k"] for x in r["assisted"]] == [1, 2]
    rows = r["model"]["rows"]
    assert {(x["drafter"], x["k"]) for x in rows} == {(d, k) for d in ("draft_model", "ngram", "eagle3") for k in (1, 2)}
    assert all(x["c"] > 0 for x in rows)
    assert r["command"].startswith("wb bench micro") and r["meta"]["device"] == "cpu"
    assert "ours / transformers" in (tmp_path / "b.md").read_text()


def test_wb_bench_bad_options():
    res = CliRunner().invoke(app, ["bench", "micro", "--k", "a,b"])
    assert res.exit_code == 2 and "--k" in res.output
    res = CliRunner().invoke(app, ["bench", "micro", "--drafters", "foo"])
    assert res.exit_code == 2 and "allowed values" in res.output
