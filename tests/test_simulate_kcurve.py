"""#33's terms and plumbing against hand-computed cases: the sampler's logit passes, the n-gram host scan,
per-k references, a variant's table replacing the base's, the implied per-step cost, the write-up markers."""

import pytest

from workbench.perf.simulate import costs
from workbench.perf.simulate.run import compare
from workbench.perf.simulate.scenario import Hardware, merge_dotted, validate
from workbench.perf.simulate.step import StepResult
from workbench.perf.simulate.validate import implied_step_cost
from workbench.perf.simulate.writeup import apply

HW = Hardware(
    flops=1e15,
    hbm_bandwidth=1e12,
    hbm_bytes=100e9,
    link_bandwidth=100e9,
    gpus_per_node=8,
    flops_efficiency=1.0,
    bandwidth_efficiency=0.5,
)


def test_sampler_s_hand_computed():
    # 256 rows x 4 positions x 151936 ids x 28 bytes over 1e12 * 0.5 B/s
    assert costs.sampler_s(HW, 1024, 151936, 28.0) == pytest.approx(1024 * 151936 * 28 / 5e11)
    assert costs.sampler_s(HW, 1024, 151936, 0.0) == 0.0 and costs.sampler_s(HW, 0, 151936, 28.0) == 0.0


def test_ngram_scan_s_threads_capped_by_rows():
    # 1.06 ns per token, 768k tokens of context: 0.814 ms on one thread, /8 on 8 threads, but 2 rows use 2
    assert costs.ngram_scan_s(768_000, 256, 1.06, 1) == pytest.approx(1.06e-9 * 768_000)
    assert costs.ngram_scan_s(768_000, 256, 1.06, 8) == pytest.approx(1.06e-9 * 768_000 / 8)
    assert costs.ngram_scan_s(768_000, 2, 1.06, 8) == pytest.approx(1.06e-9 * 768_000 / 2)
    assert costs.ngram_scan_s(768_000, 256, 0.0, 8) == 0.0


def test_variant_table_replaces_named_keys_merge():
    raw = {"speculation": {"k": 3, "acceptance_length": {3: 3.32, 5: 4.35, 7: 5.06}}}
    out = merge_dotted(raw, "speculation.acceptance_length", {3: 2.47})
    assert out["speculation"]["acceptance_length"] == {3: 2.47}  # no inherited k = 5, 7 from another drafter
    out = merge_dotted(raw, "speculation", {"k": 5})
    assert out["speculation"] == {"k": 5, "acceptance_length": {3: 3.32, 5: 4.35, 7: 5.06}}


def test_compare_reference_by_k_and_k_curve():
    r = StepResult(
        "x", 3, 8, 3.0, 100.0, 50.0, 10.0, 20.0, 0.0, 0.0, 8, 1.0, 1.0, gen_speedup_by_k={3: 2.0, 5: 1.5, 7: 1.2}
    )
    out = compare(
        r, {"gen_ar": 80.0, "gen_spec": 1.0}, {3: {"gen_spec": 40.0}, 5: {"gen_speedup": 1.2}, 9: {"gen_speedup": 1.0}}
    )
    assert out["gen_ar"] == (100.0, 80.0, pytest.approx(0.25))
    assert out["gen_spec"] == (50.0, 40.0, pytest.approx(0.25))  # the row's own k wins
    assert out["gen_speedup_k5"] == (1.5, 1.2, pytest.approx(0.25))
    assert "gen_speedup_k9" not in out and "gen_speedup_k7" not in out  # not scanned / no reference


def test_reference_by_k_validates():
    raw = {
        "model": {"preset": "qwen3-8b"},
        "hardware": {"preset": "gb200"},
        "cluster": {"gpus": 2},
        "speculation": {"alpha": 0.7},
        "reference_by_k": {"3": {"gen_speedup": 1.5}},
    }
    assert validate(raw).reference_by_k == {3: {"gen_speedup": 1.5}}


def test_implied_step_cost():
    assert implied_step_cost(3.32, 1.77) == pytest.approx(1.8757, abs=1e-4)  # RL-Zero k = 3, published
    with pytest.raises(ValueError, match="speedup"):
        implied_step_cost(3.0, 0.0)


def test_apply_replaces_only_marked_sections():
    text = "a\n<!-- BEGIN GENERATED t -->\nold\n<!-- END GENERATED t -->\nb"
    assert apply(text, {"t": "new"}) == "a\n<!-- BEGIN GENERATED t -->\nnew\n<!-- END GENERATED t -->\nb"
    with pytest.raises(ValueError, match="no generated section"):
        apply(text, {})
    with pytest.raises(ValueError, match="without a marker"):
        apply(text, {"t": "x", "u": "y"})
