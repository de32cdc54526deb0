"""wb simulate: the cost terms added for the cluster checks (#23), each against a hand-computed case."""

import math

import pytest

from workbench.perf.simulate import costs
from workbench.perf.simulate.scenario import Gen, Hardware, ModelShape

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


# ------------------------------------------------------------------ expert-parallel straggler


def test_max_rank_experts_two_ranks_one_token():
    # E = 4 experts on 2 ranks (2 each), top-1, one token: p = 1/4 per expert; a rank's count is
    # Binomial(2, 1/4): F(0) = 9/16, F(1) = 15/16; E[max of 2] = (1 − (9/16)²) + (1 − (15/16)²)
    hand = (1 - (9 / 16) ** 2) + (1 - (15 / 16) ** 2)
    assert costs.max_rank_experts(4, 1, 1, 2) == pytest.approx(hand)
    assert hand > costs.expected_experts(4, 1, 1) / 2  # the busiest rank reads more than the mean


def test_max_rank_experts_limits():
    assert costs.max_rank_experts(128, 8, 1, 1) == pytest.approx(costs.expected_experts(128, 8, 1))
    assert costs.max_rank_experts(128, 8, 1e6, 8) == pytest.approx(16)  # every expert touched: 128/8 per rank
    assert costs.max_rank_experts(128, 8, 0, 8) == 0.0


def test_weight_bytes_per_gpu_ep_uses_busiest_rank():
    dense = costs.matmul_params(Q235) - 94 * 8 * costs.expert_params(Q235)
    hand = (dense / 8 + 94 * costs.max_rank_experts(128, 8, 1, 8) * costs.expert_params(Q235)) * 2
    assert costs.weight_bytes_per_gpu(Q235, 1, 8, 8) == pytest.approx(hand)
    assert costs.weight_bytes_per_gpu(Q235, 1, 8, 1) == pytest.approx(costs.weight_bytes_read(Q235, 1) / 8)
    assert costs.weight_bytes_per_gpu(Q8, 7, 4, 1) == pytest.approx(costs.matmul_params(Q8) * 2 / 4)


# ------------------------------------------------------------------ KV heads replicated beyond tp = kv_heads


def test_kv_shard():
    assert costs.kv_shard(Q8, 1) == 1.0
    assert costs.kv_shard(Q8, 8) == pytest.approx(1 / 8)  # 8 KV heads: one per GPU
    assert costs.kv_shard(Q235, 8) == pytest.approx(1 / 4)  # 4 KV heads on 8 GPUs: each held twice


def test_forward_kv_read_replicated_on_tp8():
    g = Gen(tp=8, ep=1)
    f = costs.forward_cost(Q235, HW, g, rows=1, q=1, context=1000)
    hand = costs.weight_bytes_read(Q235, 1) / 8 + 192_512 * 1001 / 4
    assert f.memory == pytest.approx(hand / 1e12)


def test_kv_capacity_replicated():
    g = Gen(tp=8, ep=8, memory_utilization=0.9)
    free = 8 * 90e9 - costs.total_params(Q235) * 2
    assert costs.kv_capacity_tokens(Q235, HW, g) == pytest.approx(free / 8 / (192_512 / 4))
    assert math.isfinite(costs.kv_capacity_tokens(Q235, HW, g, extra_kv_per_token=1000.0))


# ------------------------------------------------------------------ acceptance varying per step


def test_acceptance_survival_and_variance_alpha():
    from workbench.perf.simulate.rollout import acceptance_length, acceptance_survival, tokens_per_step_var
    from workbench.perf.simulate.scenario import Speculation

    s = Speculation(alpha=0.5)
    assert acceptance_survival(s, 2) == [1.0, 0.5, 0.25]
    # N ∈ {1, 2, 3} with P = 0.5, 0.25, 0.25: E = 1.75, E[N²] = 0.5 + 1 + 2.25 = 3.75, Var = 3.75 − 3.0625
    assert tokens_per_step_var(s, 2) == pytest.approx(0.6875)
    assert sum(acceptance_survival(s, 2)) == pytest.approx(acceptance_length(s, 2))
    assert tokens_per_step_var(s, 0) == 0.0


def test_acceptance_survival_measured_and_per_position():
    from workbench.perf.simulate.rollout import acceptance_length, acceptance_survival
    from workbench.perf.simulate.scenario import Speculation

    m = Speculation(acceptance_length={3: 2.47})
    assert sum(acceptance_survival(m, 3)) == pytest.approx(2.47)
    p = Speculation(per_position=[0.8, 0.6])
    assert acceptance_survival(p, 2) == [1.0, 0.8, 0.6]
    assert sum(acceptance_survival(p, 4)) == pytest.approx(acceptance_length(p, 4))


def test_row_steps_deterministic_and_bounds():
    import numpy as np

    from workbench.perf.simulate.rollout import row_steps

    L = np.array([1, 2, 11, 101])
    assert row_steps(L, 2.5, 0.0, 3, None).tolist() == [0, 1, 4, 40]  # ceil((L − 1) / 2.5)
    rng = np.random.default_rng(0)
    s = row_steps(np.full(20000, 10_001), 2.5, 1.0, 3, rng)
    # renewal CLT: mean 10000/2.5 = 4000, sd sqrt(10000 · 1 / 2.5³) = 25.3 (+0.5 for the rounding up)
    assert s.mean() == pytest.approx(4000.5, abs=1.0)
    assert s.std() == pytest.approx(math.sqrt(10_000 / 2.5**3), rel=0.05)
    huge = row_steps(np.array([5]), 2.0, 1e6, 3, np.random.default_rng(1))
    assert 1 <= huge[0] <= 4  # within (L − 1)/(k + 1) .. L − 1


# ------------------------------------------------------------------ the drafter's passes


def test_draft_s_eagle_first_pass_over_verified_positions():
    from workbench.perf.simulate.rollout import draft_s

    def fwd(rows, q, ctx):
        return rows * q + ctx  # a linear stand-in

    # eagle3, k = 3, 4 rows, context 10: first pass 4·4 + 10, then 2 × (4·1 + 10)
    assert draft_s(Q8, 4, 10, 3, fwd, "eagle3") == 26 + 2 * 14
    assert draft_s(Q8, 4, 10, 3, fwd, "draft_model") == 3 * 14
    assert draft_s(Q8, 4, 10, 0, fwd, "eagle3") == 0.0
