"""wb simulate: each term against hand-computed cases, the scenario's errors, the gen-stage simulation."""

import json
import math

import numpy as np
import pytest

from workbench.perf.simulate import costs, rollout
from workbench.perf.simulate.run import compare, parse_grid, solve_monotone
from workbench.perf.simulate.scenario import (
    Gen,
    Hardware,
    ModelShape,
    Speculation,
    load_scenario,
    validate,
    variant_raw,
)
from workbench.perf.simulate.step import StepResult, sequence_flops, simulate, split_gpus, train_s
from workbench.specs import SpecError

Q8 = ModelShape(preset="qwen3-8b")
Q235 = ModelShape(preset="qwen3-235b-a22b")
HW = Hardware(
    flops=1e15,
    hbm_bandwidth=1e12,
    hbm_bytes=100e9,
    link_bandwidth=100e9,
    gpus_per_node=8,
    flops_efficiency=1.0,
    bandwidth_efficiency=1.0,
    collective_latency_s=0.0,
)


def tiny(**over):
    raw = {
        "model": {"preset": "qwen3-8b"},
        "hardware": {"preset": "gb200"},
        "cluster": {"gpus": 2},
        "workload": {"prompts": 4, "group_size": 2, "prompt_len": 10, "response": {"mean": 50, "cv": 0.5, "max": 100}},
        "speculation": {"alpha": 0.7, "k": 2, "k_scan": [1, 2, 3]},
    }
    for k, v in over.items():
        from workbench.specs.dotted import set_dotted

        raw = set_dotted(raw, k, v)
    return validate(raw)


# ------------------------------------------------------------------ parameter counts (hand-computed)


def test_qwen3_8b_params():
    # 36 × (q,o 2·4096·4096 + k,v 2·4096·1024 + MLP 3·4096·12288) + untied embeddings 2·151936·4096
    assert (
        costs.total_params(Q8)
        == 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 2 * 151936 * 4096
        == 8_190_427_136
    )
    assert costs.active_params(Q8) == costs.total_params(Q8)
    assert costs.matmul_params(Q8) == 8_190_427_136 - 151936 * 4096


def test_qwen3_235b_params():
    assert costs.attention_params(Q235) == 71_303_168
    assert costs.expert_params(Q235) == 18_874_368
    assert (
        costs.total_params(Q235)
        == 94 * (71_303_168 + 4096 * 128 + 128 * 18_874_368) + 2 * 151936 * 4096
        == 235_092_836_352
    )
    assert (
        costs.active_params(Q235) == 94 * (71_303_168 + 4096 * 128 + 8 * 18_874_368) + 1_244_659_712 == 22_189_965_312
    )


def test_param_overrides_win():
    m = Q8.model_copy(update={"total_params": 1e9, "active_params": 5e8})
    assert costs.total_params(m) == 1e9 and costs.active_params(m) == 5e8


def test_kv_bytes_per_token():
    assert costs.kv_bytes_per_token(Q8) == 2 * 36 * 8 * 128 * 2 == 147_456
    assert costs.kv_bytes_per_token(Q235) == 2 * 94 * 4 * 128 * 2 == 192_512
    assert costs.kv_bytes_per_token(Q8.model_copy(update={"kv_bytes": 1.0})) == 73_728


# ------------------------------------------------------------------ FLOPs, bytes, experts


def test_attention_flops():
    assert costs.attention_flops(Q8, q=4, context=1000) == 4 * 36 * 32 * 128 * 4 * 1000


def test_linear_flops():
    assert costs.linear_flops(Q8, 10) == 2 * costs.matmul_params(Q8) * 10


@pytest.mark.parametrize("tokens,expected", [(0, 0.0), (1, 8.0), (2, 128 * (1 - (1 - 8 / 128) ** 2))])
def test_expected_experts(tokens, expected):
    assert costs.expected_experts(128, 8, tokens) == pytest.approx(expected)


def test_expected_experts_saturate():
    assert costs.expected_experts(128, 8, 10_000) == pytest.approx(128)
    assert costs.expected_experts(0, 0, 10) == 0.0


def test_moe_weight_bytes_grow_with_tokens():
    one = costs.weight_bytes_read(Q235, 1)
    dense_part = (costs.matmul_params(Q235) - 94 * 8 * costs.expert_params(Q235)) * 2
    assert one == pytest.approx(dense_part + 94 * 8 * costs.expert_params(Q235) * 2)
    assert costs.weight_bytes_read(Q235, 1e6) == pytest.approx(dense_part + 94 * 128 * costs.expert_params(Q235) * 2)


def test_dense_weight_bytes_do_not_depend_on_tokens():
    assert costs.weight_bytes_read(Q8, 1) == costs.weight_bytes_read(Q8, 512) == costs.matmul_params(Q8) * 2


# ------------------------------------------------------------------ communication


def test_allreduce_ring():
    assert costs.allreduce_s(1e6, 1, 1e9, 1e-5) == 0.0
    assert costs.allreduce_s(1e6, 2, 1e9, 0.0) == pytest.approx(1e-3)
    assert costs.allreduce_s(1e6, 8, 1e9, 1e-5) == pytest.approx(2 * 7 / 8 * 1e-3 + 1e-5)


def test_alltoall():
    assert costs.alltoall_s(8e6, 8, 1e9, 0.0) == pytest.approx(7 / 8 * 1e6 / 1e9)
    assert costs.alltoall_s(8e6, 1, 1e9, 0.0) == 0.0


def test_comm_two_allreduces_per_layer():
    g = Gen(tp=2)
    act = 3 * 4096 * 2
    assert costs.comm_s(Q8, HW, g, 3) == pytest.approx(36 * 2 * costs.allreduce_s(act, 2, 100e9, 0.0))
    assert costs.comm_s(Q8, HW, Gen(tp=1), 3) == 0.0


def test_link_bandwidth_beyond_domain():
    assert costs.link_bandwidth(HW, 8) == 100e9
    assert costs.link_bandwidth(HW, 16) == HW.scaleout_bandwidth


# ------------------------------------------------------------------ one forward


def test_forward_memory_bound_single_row():
    f = costs.forward_cost(Q8, HW, Gen(), rows=1, q=1, context=1000)
    assert f.bound == "memory"
    assert f.memory == pytest.approx((costs.matmul_params(Q8) * 2 + 147_456 * 1001) / 1e12)
    assert f.seconds == pytest.approx(f.memory)


def test_forward_compute_bound_large_batch():
    f = costs.forward_cost(Q8, HW, Gen(), rows=4096, q=1, context=0)
    assert f.bound == "compute"
    assert f.compute == pytest.approx(2 * costs.matmul_params(Q8) * 4096 / 1e15)


def test_forward_tp_divides_and_overhead_adds():
    a = costs.forward_cost(Q8, HW, Gen(tp=1), 1, 1, 0)
    b = costs.forward_cost(Q8, HW, Gen(tp=2), 1, 1, 0, overhead=1e-3)
    assert b.memory == pytest.approx(a.memory / 2)
    assert b.seconds == pytest.approx(a.memory / 2 + b.comm + 1e-3)


def test_kv_capacity():
    cap = costs.kv_capacity_tokens(Q8, HW, Gen(memory_utilization=0.9))
    assert cap == pytest.approx((90e9 - costs.total_params(Q8) * 2) / 147_456)


# ------------------------------------------------------------------ acceptance and lengths


def test_acceptance_alpha():
    assert rollout.acceptance_length(Speculation(alpha=0.5), 3) == pytest.approx(1.875)
    assert rollout.acceptance_length(Speculation(alpha=0.5), 0) == 1.0


def test_acceptance_per_position_and_extension():
    s = Speculation(per_position=[0.8, 0.6])
    assert rollout.acceptance_length(s, 2) == pytest.approx(2.4)
    assert rollout.acceptance_length(s, 3) > 2.4


def test_acceptance_measured_exact_and_nearest():
    s = Speculation(acceptance_length={3: 2.47})
    assert rollout.acceptance_length(s, 3) == 2.47
    assert 2.47 < rollout.acceptance_length(s, 5) < 3.0


def test_response_lengths_constant_and_cut():
    sc = tiny(**{"workload.response.cv": 0.0})
    assert set(rollout.response_lengths(sc).tolist()) == {50}
    sc = tiny(**{"workload.response.mean": 1000, "workload.response.cv": 0.0})
    assert set(rollout.response_lengths(sc).tolist()) == {100}


def test_response_lengths_given_list():
    sc = tiny(**{"workload.response.kind": "lengths", "workload.response.lengths": [7] * 8})
    assert rollout.response_lengths(sc).tolist() == [7] * 8


def test_drafter_shape_eagle3():
    d = rollout.drafter_shape(tiny(**{"speculation.drafter": "eagle3"}))
    assert d.layers == 1 and d.vocab == 32000
    one_layer = costs.attention_params(Q8) + 3 * 4096 * 12288
    assert costs.active_params(d) == one_layer + 32000 * 4096 + 3 * 4096 * 4096
    assert rollout.drafter_shape(tiny(**{"speculation.drafter": "ngram"})) is None


# ------------------------------------------------------------------ one replica


def unit(rows, ctx):
    return 1.0


def test_replica_single_row_autoregressive():
    t, rs, steps = rollout.replica_time(np.array([5]), 1, 8, 1e9, 1.0, unit, lambda n: 0.5)
    assert (t, rs, steps) == (0.5 + 4, 4, 4)


def test_replica_rows_leave_as_they_finish():
    t, rs, steps = rollout.replica_time(np.array([3, 5]), 1, 8, 1e9, 1.0, unit, lambda n: 0.0)
    assert (t, rs, steps) == (4, 2 + 4, 4)


def test_replica_max_rows_queues():
    t, rs, steps = rollout.replica_time(np.array([3, 5]), 1, 1, 1e9, 1.0, unit, lambda n: 0.0)
    assert (t, steps) == (2 + 4, 6)


def test_replica_kv_capacity_queues():
    t, _, steps = rollout.replica_time(np.array([3, 5]), 1, 8, 7, 1.0, unit, lambda n: 0.0)
    assert steps == 6  # 1+3 and 1+5 tokens do not fit 7 together


def test_replica_speculative_steps():
    _, _, steps = rollout.replica_time(np.array([9]), 1, 8, 1e9, 2.5, unit, lambda n: 0.0)
    assert steps == math.ceil(8 / 2.5)


def test_replica_row_too_long():
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        rollout.replica_time(np.array([100]), 10, 8, 50, 1.0, unit, lambda n: 0.0)


def test_replica_context_growth_integrated():
    # step seconds = context; one row, prompt 1 -> contexts 2, 3, 4 over 3 steps: Simpson on a line is exact
    t, _, _ = rollout.replica_time(np.array([4]), 1, 8, 1e9, 1.0, lambda r, c: c, lambda n: 0.0)
    assert t == pytest.approx(2 + 3 + 4)
    # one rate per row: rows of 4 and 7 tokens, 3 steps each at 1 and 2 tokens a step: contexts 2, 3, 4 and 2, 4, 6
    t, _, _ = rollout.replica_time(
        np.array([4, 7]), 1, 8, 1e9, np.array([1.0, 2.0]), lambda r, c: c, lambda n: 0.0, np.array([3, 3])
    )
    assert t == pytest.approx((2 + 2) + (3 + 4) + (4 + 6))


# ------------------------------------------------------------------ step, async, calibration


def test_sequence_and_train_flops():
    assert sequence_flops(Q8, 100) == pytest.approx(2 * costs.matmul_params(Q8) * 100 + 2 * 36 * 32 * 128 * 100**2)
    sc = tiny(**{"workload.response.cv": 0.0})
    expect = 3 * 8 * sequence_flops(Q8, 60) / (sc.train.mfu * sc.hardware.flops * 2)
    assert train_s(sc, rollout.response_lengths(sc), 2) == pytest.approx(expect)


def test_split_gpus():
    assert split_gpus(tiny(**{"cluster.gpus": 8, "gen.tp": 2, "async.gen_fraction": 0.5})) == (4, 4)
    assert split_gpus(tiny(**{"cluster.gpus": 2, "async.gen_fraction": 0.9})) == (1, 1)


def test_step_result_speedups():
    r = StepResult("x", 3, 8, 2.5, 100.0, 50.0, 10.0, 20.0, 0.0, 0.0, 1, 1.0, 1.0, async_spec=40.0)
    assert r.step_ar == 130 and r.step_spec == 80 and r.gen_speedup == 2
    assert r.e2e_speedup == pytest.approx(130 / 40)


def test_simulate_tiny_and_async():
    res = simulate(tiny())
    assert res.gen_spec < res.gen_ar and res.best_k in (1, 2, 3) and res.async_ar is None
    a = simulate(tiny(**{"async.staleness": 1, "async.cv": 0.0}))
    assert a.async_ar is not None and a.async_spec <= a.async_ar


def test_solve_monotone():
    assert solve_monotone(lambda x: 3 * x + 1, 7.0, 0.0, 10.0) == pytest.approx(2.0, rel=1e-4)
    assert solve_monotone(lambda x: 1 / x, 4.0, 0.01, 1.0) == pytest.approx(0.25, rel=1e-3)
    with pytest.raises(ValueError, match="no value"):
        solve_monotone(lambda x: x, 20.0, 0.0, 10.0)


def test_compare():
    r = StepResult("x", 3, 8, 2.5, 100.0, 50.0, 0.0, 0.0, 0.0, 0.0, 1, 1.0, 1.0)
    assert compare(r, {"gen_ar": 80.0})["gen_ar"] == (100.0, 80.0, pytest.approx(0.25))


def test_reference_by_gpus_scores_each_row_against_its_own_gpu_count():
    """The 235B projection's values differ by GPU count: a row at 512 GPUs is scored against 512's values,
    a row at a count with none against the scenario's every-point reference."""
    from workbench.perf.simulate.run import run
    from workbench.perf.simulate.scenario import load_scenario

    raw, base = load_scenario("qwen3-235b-gb200")
    assert set(base.reference_by_gpus) == {512, 2048}
    raw = {**raw, "reference": {"e2e_speedup": 9.0}, "workload": {**raw["workload"], "prompts": 32}}
    _, rows = run(raw, base, ["gpus=512,64", "k=3"])
    by_gpus = {r.result.gpus: r.errors for r in rows}
    assert by_gpus[512]["rollout_speedup"][1] == 6.49 and by_gpus[512]["e2e_speedup"][1] == 2.22
    assert by_gpus[64]["e2e_speedup"][1] == 9.0 and "rollout_speedup" not in by_gpus[64]


def test_parse_grid_aliases():
    grid, fixed = parse_grid(["k=1..3", "gpus=64,512", "staleness=1"])
    assert len(grid) == 6 and grid[0] == {"speculation.k": "1", "cluster.gpus": "64"}
    assert fixed == [("async.staleness", "1")]


# ------------------------------------------------------------------ the scenario


def test_unknown_key_names_field():
    with pytest.raises(SpecError, match=r"hardware.flops_eff.*Did you mean 'hardware.flops_efficiency'"):
        validate(
            {"model": {"preset": "qwen3-8b"}, "hardware": {"preset": "gb200", "flops_eff": 0.5}, "cluster": {"gpus": 8}}
        )


def test_unknown_preset():
    with pytest.raises(SpecError, match="unknown model preset"):
        validate({"model": {"preset": "nope"}, "hardware": {"preset": "gb200"}, "cluster": {"gpus": 8}})


def test_ep_must_match_tp():
    with pytest.raises(SpecError, match="gen.ep"):
        tiny(**{"gen.tp": 2, "gen.ep": 4})


def test_acceptance_given_twice():
    with pytest.raises(SpecError, match="exactly one"):
        tiny(**{"speculation.per_position": [0.5]})


def test_hf_config_loader(tmp_path):
    cfg = {
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = ModelShape(hf_config=str(tmp_path / "config.json"))
    assert costs.total_params(m) == costs.total_params(Q8)
    moe = {**cfg, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536}
    (tmp_path / "moe.json").write_text(json.dumps(moe))
    assert ModelShape(hf_config=str(tmp_path / "moe.json")).experts == 128


def test_variant_merges_nested_and_dotted():
    raw = {
        "workload": {"response": {"mean": 5, "cv": 1.0}},
        "variants": {"a": {"workload.response.cv": 2.0}, "b": {"workload": {"response": {"cv": 3.0}}}},
    }
    assert variant_raw(raw, "a")["workload"]["response"] == {"mean": 5, "cv": 2.0}
    assert variant_raw(raw, "b")["workload"]["response"] == {"mean": 5, "cv": 3.0}
    with pytest.raises(SpecError, match="not in the scenario"):
        variant_raw(raw, "c")


def test_shipped_scenarios_load():
    for name in ("qwen3-8b-gb200", "qwen3-235b-gb200"):
        raw, sc = load_scenario(name)
        assert sc.cluster.gpus >= 32


def test_calibration_unknown_none_from_the_command_line():
    """`calibration.unknown=none` reads as null from an override; it still means no calibration."""
    from workbench.perf.simulate.scenario import load_scenario

    _, sc = load_scenario("qwen3-8b-gb200", ["calibration.unknown=none"])
    assert sc.calibration.unknown == "none"
