"""wb simulate: the cost terms added for the cluster checks (#23), each against a hand-computed case."""

import math

import pytest

from workbench.simulate import costs
from workbench.simulate.scenario import Gen, Hardware, ModelShape

Q8 = ModelShape(preset="qwen3-8b")
Q235 = ModelShape(preset="qwen3-235b-a22b")
HW = Hardware(flops=1e15, hbm_bandwidth=1e12, hbm_bytes=100e9, link_bandwidth=100e9, gpus_per_node=8,
              flops_efficiency=1.0, bandwidth_efficiency=1.0, collective_latency_s=0.0)


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
