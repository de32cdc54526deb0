"""wb bench: the performance model's maths it reports (workbench.perf), and the structure of a tiny real benchmark
(values are measured, never asserted)."""

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.perf.steps import batch_predicted_speedup
from workbench.rollout.cost import expected_tokens, fit_alpha
from workbench.rollout.cost import gen_speedup as predicted_speedup


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


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    """(target, draft): random qwen3 checkpoint folders (not Llama: q/k norm, head_dim != hidden / heads)."""
    from workbench.models.shapes import random_checkpoint

    root = tmp_path_factory.mktemp("qwen3")
    target = random_checkpoint(
        "qwen3", root / "target", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96
    )
    draft = random_checkpoint("qwen3", root / "draft", seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    return target, draft


# eagle3's init (trained on first use): a few prompts and steps
TINY_INIT = [
    "drafter.init.num_prompts=8",
    "drafter.init.steps=2",
    "drafter.init.batch_size=4",
    "rollout.max_new_tokens=8",
]


def test_wb_bench_qwen3_on_cpu_writes_results(tmp_path, qwen3_pair):
    target, draft = qwen3_pair
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "micro",
            *TINY_INIT,
            "--device",
            "cpu",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--batch-sizes",
            "1,2",
            "--k",
            "1,2",
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
            "--model-batch",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "b",
            "--drafters",
            "draft_model,ngram,eagle3",
        ],
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "b.json").read_text())
    assert [x["batch"] for x in r["ar"]] == [1, 2]
    for x in r["ar"]:
        assert x["ours_tok_s"] > 0 and x["hf_generate_tok_s"] > 0 and x["hf_static_tok_s"] > 0
        assert x["hf_static_setting"] == "static cache" and x["hf_errors"] == {}  # --hf-compile is off on the CPU
        assert x["ratio"] == pytest.approx(
            min(x["ours_tok_s"] / x["hf_generate_tok_s"], x["ours_tok_s"] / x["hf_static_tok_s"])
        )
        assert x["ours_peak_mib"] is None and x["hf_generate_peak_mib"] is None and x["hf_static_peak_mib"] is None
    assert [x["k"] for x in r["assisted"]] == [1, 2]
    assert all(x["ours_spec_peak_mib"] is None and x["hf_assisted_error"] is None for x in r["assisted"])
    rows = r["model"]["rows"]
    assert {(x["drafter"], x["k"]) for x in rows} == {
        (d, k) for d in ("draft_model", "ngram", "eagle3") for k in (1, 2)
    }
    assert all(x["c"] > 0 and x["spec_peak_mib"] is None for x in rows)
    meta = r["meta"]
    assert (
        meta["device"] == "cpu"
        and meta["dtype"] == "float32"
        and meta["target"] == str(target)
        and meta["draft"] == str(draft)
    )
    assert meta["resident_mib"] is None and meta["hf_compile"] is False
    assert r["command"].startswith("wb bench micro") and f"--target {target}" in r["command"]
    md = (tmp_path / "b.md").read_text()
    assert "ours / best transformers" in md and "peak MiB" not in md  # no memory columns off CUDA
    assert meta["host"] and f"Machine: {meta['host']}." in md  # the CPU model and its instruction sets
    assert meta["engine_path"] == "eager, packed weights"  # rollout.prepack_weights left null: CPU float32 packs
    assert "Workbench engine: eager, packed weights" in md


def test_bench_records_a_failing_transformers_setting_and_keeps_the_dtype(qwen3_pair, monkeypatch):
    """A static-cache setting that raises is recorded (the next one is timed); bf16 everywhere."""
    import torch

    import workbench.bench.core as core
    from workbench.bench import Bench, BenchConfig
    from workbench.specs import load_spec

    target, draft = qwen3_pair
    monkeypatch.setattr(core, "COMPILE_SETTINGS", ({"mode": "no-such-mode"},))
    spec = load_spec(
        "micro", ["model.device=cpu", "model.dtype=bfloat16", f"model.target={target}", f"drafter.model={draft}"]
    )
    b = Bench(spec, BenchConfig(batch_sizes=(1,), max_new_tokens=4, repeats=1, model_batch=1, hf_compile=True))
    (row,) = b.run_ar()
    assert row["hf_static_setting"] == "static cache" and row["hf_static_tok_s"] > 0
    assert list(row["hf_errors"]) == ["static cache + torch.compile(mode=no-such-mode)"]
    assert "no-such-mode" in row["hf_errors"]["static cache + torch.compile(mode=no-such-mode)"]
    eng = b._engine("draft_model", 1)  # draft_model loads float32 by itself: the bench casts it
    assert {eng.drafter.model.lm_head.weight.dtype, b.target.lm_head.weight.dtype, b.hf_draft.dtype} == {torch.bfloat16}


def test_paired_median_keeps_the_largest_peak_including_first_calls(monkeypatch):
    """Peak memory per contender: the largest over warm-up, timed calls and an earlier first call
    (where compiled contenders allocate CUDA graphs); None where nothing was measured (the CPU)."""
    import workbench.bench.core as core

    peaks = iter([3.0, 1.0, 7.0, 2.0, 4.0, 5.0])  # a, b warm-ups; then (a, b) twice
    monkeypatch.setattr(core, "measure", lambda fn, device: core.Timing(1.0, fn(), next(peaks)))
    t = core._paired_median({"a": lambda: "A", "b": lambda: "B"}, 2, None, first_peaks={"a": 9.0, "b": None})
    assert (t["a"].peak_mib, t["b"].peak_mib) == (9.0, 5.0) and (t["a"].out, t["a"].seconds) == ("A", 1.0)
    monkeypatch.setattr(core, "measure", lambda fn, device: core.Timing(1.0, fn(), None))
    assert core._paired_median({"a": lambda: 0}, 1)["a"].peak_mib is None


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_wb_bench_cuda_without_cuda_names_device():
    res = CliRunner().invoke(app, ["bench", "micro", "--device", "cuda"])
    assert res.exit_code == 2 and "--device cuda" in res.output and "CUDA is not available" in res.output
    res = CliRunner().invoke(app, ["bench", "micro", "--device", "gpu"])
    assert res.exit_code == 2 and "--device" in res.output and "cpu, cuda, cuda:N" in res.output
    res = CliRunner().invoke(app, ["bench", "micro", "--dtype", "fp8"])
    assert res.exit_code == 2 and "--dtype" in res.output
    res = CliRunner().invoke(app, ["bench", "micro", "--cuda-graphs", "--no-hf", "--batch-sizes", "1", "--k", "1"])
    assert res.exit_code == 2 and "--cuda-graphs" in res.output and "CUDA device" in res.output


def test_wb_bench_bad_options():
    res = CliRunner().invoke(app, ["bench", "micro", "--k", "a,b"])
    assert res.exit_code == 2 and "--k" in res.output
    res = CliRunner().invoke(app, ["bench", "micro", "--drafters", "foo"])
    assert res.exit_code == 2 and "allowed values" in res.output


def test_paired_speedup_ci_over_the_interleaved_repeats():
    """Repeat i of the speculative and the autoregressive contender is a pair: ratios 2, 1, 2 ->
    geometric mean 4^(1/3), a Student-t interval on the logs that contains it; rendered in the row."""
    import math

    from workbench.bench.core import paired_speedup_ci
    from workbench.bench.render import _ci
    from workbench.timing import Timing

    ci = paired_speedup_ci(Timing(1.0, None, None, (2.0, 1.0, 4.0)), Timing(1.0, None, None, (1.0, 1.0, 2.0)))
    assert ci.n == 3 and ci.mean == pytest.approx(4 ** (1 / 3))
    assert ci.low < ci.mean < ci.high
    logs = [math.log(2), 0.0, math.log(2)]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    assert math.log(ci.high) - m == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)  # t(0.975, 2 df)
    assert _ci({"speedup_mean": ci.mean, "speedup_ci95_low": ci.low, "speedup_ci95_high": ci.high}).startswith("1.59 [")
    assert _ci({}) == "-"


def test_draft_label_names_the_draft_the_bench_runs():
    # a draft built from the target's own layers is not drafter.model (which is then not read)
    from workbench.bench.machine import draft_label
    from workbench.specs import load_spec

    d = load_spec("quickstart").drafter
    assert draft_label(d) == d.model
    d2 = d.model_copy(update={"draft_layers": 4})
    assert "first 4 layers" in draft_label(d2) and d.model not in draft_label(d2)
