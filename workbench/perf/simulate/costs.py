"""The cost of one forward on a generation replica, term by term (pure functions; seconds, bytes, FLOPs).

One forward over ``rows`` rows of ``q`` new tokens each (decode q = 1, verification q = k + 1,
prefill q = prompt), the rows having ``context`` tokens in their KV cache in all, on a replica of
``tp`` GPUs (docs/design.md §13; roofline: Williams et al. 2009):

    seconds = max(compute, memory) + communication + overhead

- compute = FLOPs / (tp · peak · flops_efficiency), FLOPs = 2 · matmul params · tokens (Kaplan et
  al. 2020, arXiv 2001.08361: 2N per token forward) + attention 4 · layers · heads · head_dim · q ·
  context (QKᵀ and P·V, 2 FLOPs per multiply-add; it grows with context);
- memory = bytes on the busiest GPU / (bandwidth · bandwidth_efficiency), bytes = weights read once
  per forward, split over tp (for MoE: the non-expert weights plus the *expected distinct experts*
  the batch's tokens touch, E·(1 − (1 − topk/E)^tokens) per layer, uniform independent routing;
  with experts spread over ep ranks, the busiest rank's experts, :func:`max_rank_experts`) + the KV
  cache read at every row's context, 2 · layers · kv_heads · head_dim · kv_bytes per token (K and
  V), + the new tokens' KV written, each GPU holding 1/tp of it, or 1/kv_heads when vLLM replicates
  the KV heads (tp > kv_heads, :func:`kv_shard`);
- communication (tp > 1): two all-reduces per layer (after attention and after the MLP) of
  tokens · hidden · 2 bytes, ring all-reduce 2(tp−1)/tp · bytes / link bandwidth + a fixed latency
  (Patarasuk & Yuan 2009; NCCL's bus-bandwidth convention); with experts spread over the replica
  (ep = tp) the MoE all-reduce becomes dispatch + combine all-to-all of tokens · topk · hidden · 2
  bytes · (ep−1)/ep over the ep GPUs; over the NVLink domain's size, the scale-out bandwidth;
- overhead: a fixed per-forward second count (scheduling, sampling, kernel launches), a calibration
  candidate.

Outside the forward (added per step by :mod:`workbench.perf.simulate.rollout`): the sampler's passes over
the fp32 logits of every sampled position (:func:`sampler_s`) and an n-gram drafter's host scan of
the live rows' tokens (:func:`ngram_scan_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.perf.simulate.scenario import Gen, Hardware, ModelShape

ACT_BYTES = 2.0  # bf16 activations exchanged by collectives


# ------------------------------------------------------------------ parameter counts


def attention_params(m: ModelShape) -> int:
    """Per layer: q (hidden × heads·head_dim), k and v (hidden × kv_heads·head_dim each), o (heads·head_dim ×
    hidden)."""
    return 2 * m.hidden * m.heads * m.head_dim + 2 * m.hidden * m.kv_heads * m.head_dim


def expert_params(m: ModelShape) -> int:
    """One expert (SwiGLU: gate, up, down): 3 · hidden · moe_intermediate."""
    return 3 * m.hidden * m.moe_intermediate


def mlp_params(m: ModelShape, active: bool) -> int:
    """Per layer: dense SwiGLU 3 · hidden · intermediate, or MoE router (hidden × E) + E experts
    (``active``: only experts_per_token of them)."""
    if not m.experts:
        return 3 * m.hidden * m.intermediate
    n = m.experts_per_token if active else m.experts
    return m.hidden * m.experts + n * expert_params(m)


def embedding_params(m: ModelShape) -> int:
    """Input embedding + LM head (vocab × hidden each, once if tied)."""
    return m.vocab * m.hidden * (1 if m.tied_embeddings else 2)


def total_params(m: ModelShape) -> float:
    """Every weight (norms ignored: < 0.01 %); ``m.total_params`` overrides."""
    if m.total_params:
        return m.total_params
    return m.layers * (attention_params(m) + mlp_params(m, active=False)) + embedding_params(m)


def active_params(m: ModelShape) -> float:
    """Weights one token uses (MoE: experts_per_token experts per layer); ``m.active_params`` overrides."""
    if m.active_params:
        return m.active_params
    return m.layers * (attention_params(m) + mlp_params(m, active=True)) + embedding_params(m)


def matmul_params(m: ModelShape) -> float:
    """Active weights in matmuls: active params less an untied input embedding (a lookup, no FLOPs;
    a tied one is the LM head's matmul too)."""
    return active_params(m) - (0 if m.tied_embeddings else m.vocab * m.hidden)


# ------------------------------------------------------------------ FLOPs and bytes


def linear_flops(m: ModelShape, tokens: float) -> float:
    """2 · matmul params · tokens: one multiply-add per weight per token."""
    return 2.0 * matmul_params(m) * tokens


def attention_flops(m: ModelShape, q: float, context: float) -> float:
    """4 · layers · heads · head_dim · q · context: QKᵀ and P·V for q new tokens of each row over
    ``context`` cached tokens summed over the rows."""
    return 4.0 * m.layers * m.heads * m.head_dim * q * context


def kv_bytes_per_token(m: ModelShape) -> float:
    """2 (K and V) · layers · kv_heads · head_dim · kv_bytes."""
    return 2.0 * m.layers * m.kv_heads * m.head_dim * m.kv_bytes


def expected_experts(experts: int, topk: int, tokens: float) -> float:
    """Distinct experts a layer reads for ``tokens`` tokens, each routed to ``topk`` of ``experts``
    uniformly and independently: E · (1 − (1 − topk/E)^tokens)."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


def weight_bytes_read(m: ModelShape, tokens: float) -> float:
    """Weight bytes one forward over ``tokens`` tokens reads: all matmul weights for a dense model;
    for MoE the non-expert weights plus the expected distinct experts per layer."""
    if not m.experts:
        return matmul_params(m) * m.bytes_per_param
    dense = matmul_params(m) - m.layers * m.experts_per_token * expert_params(m)
    moe = m.layers * expected_experts(m.experts, m.experts_per_token, tokens) * expert_params(m)
    return (dense + moe) * m.bytes_per_param


def max_rank_experts(experts: int, topk: int, tokens: float, ep: int) -> float:
    """Expected distinct experts the *busiest* of ``ep`` expert-parallel ranks reads in one layer for
    ``tokens`` tokens: each rank holds E/ep experts, each touched with p = 1 − (1 − topk/E)^tokens
    (uniform independent routing, as :func:`expected_experts`), so a rank's count is Binomial(E/ep, p)
    and E[max over ep ranks] = Σ_{j=0}^{n−1} (1 − F(j)^ep) (the order-statistics identity for a
    non-negative integer maximum). The layer waits for its slowest rank (the combine all-to-all
    gathers every rank's output), so this, not E[touched]/ep, sets the expert bytes per GPU.
    ep = 1: :func:`expected_experts`."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    if ep <= 1:
        return expected_experts(experts, topk, tokens)
    n = experts // ep
    p = 1.0 - (1.0 - topk / experts) ** tokens
    pmf = [math.comb(n, j) * p**j * (1.0 - p) ** (n - j) for j in range(n + 1)]
    cdf, out = 0.0, 0.0
    for j in range(n):
        cdf += pmf[j]
        out += 1.0 - min(cdf, 1.0) ** ep
    return out


def kv_shard(m: ModelShape, tp: int) -> float:
    """Share of one token's KV cache each of ``tp`` GPUs stores and reads: 1/tp while tp ≤ kv_heads;
    beyond, vLLM replicates the KV heads (one head per GPU: ``num_kv_heads = max(1, total_num_kv_heads
    // tp_size)`` in its Qwen3/Qwen3-MoE attention), so 1/kv_heads."""
    return max(1.0 / tp, 1.0 / m.kv_heads)


def weight_bytes_per_gpu(m: ModelShape, tokens: float, tp: int, ep: int) -> float:
    """Weight bytes the busiest GPU of a replica reads in one forward over ``tokens`` tokens: the
    non-expert weights split over tp; for MoE with experts spread (ep > 1) the busiest rank's
    experts (:func:`max_rank_experts`), else the expected distinct experts tensor-split over tp."""
    if not m.experts or ep <= 1:
        return weight_bytes_read(m, tokens) / tp
    dense = matmul_params(m) - m.layers * m.experts_per_token * expert_params(m)
    moe = m.layers * max_rank_experts(m.experts, m.experts_per_token, tokens, ep) * expert_params(m)
    return (dense / tp + moe) * m.bytes_per_param


def weight_bytes_resident(m: ModelShape) -> float:
    """Bytes the weights take in HBM (all of them, experts included)."""
    return total_params(m) * m.bytes_per_param


# ------------------------------------------------------------------ communication


def allreduce_s(nbytes: float, gpus: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``gpus``: 2(g−1)/g · bytes / bandwidth + latency (0 for g = 1)."""
    if gpus <= 1:
        return 0.0
    return 2.0 * (gpus - 1) / gpus * nbytes / bandwidth + latency


def alltoall_s(nbytes: float, gpus: int, bandwidth: float, latency: float) -> float:
    """All-to-all where each GPU holds 1/g of ``nbytes`` and keeps 1/g of it: (g−1)/g · bytes/g / bandwidth +
    latency."""
    if gpus <= 1:
        return 0.0
    return (gpus - 1) / gpus * nbytes / gpus / bandwidth + latency


def link_bandwidth(hw: Hardware, gpus: int) -> float:
    """NVLink inside one domain, the scale-out network beyond it."""
    return hw.link_bandwidth if gpus <= hw.gpus_per_node else hw.scaleout_bandwidth


def comm_s(m: ModelShape, hw: Hardware, gen: Gen, tokens: float) -> float:
    """Collectives of one forward over ``tokens`` tokens on a replica of gen.tp GPUs (module doc)."""
    tp, bw, lat = gen.tp, link_bandwidth(hw, gen.tp), hw.collective_latency_s
    act = tokens * m.hidden * ACT_BYTES
    attn = m.layers * allreduce_s(act, tp, bw, lat)
    if m.experts and gen.ep > 1:
        mlp = m.layers * 2 * alltoall_s(act * m.experts_per_token, gen.ep, bw, lat)
    else:
        mlp = m.layers * allreduce_s(act, tp, bw, lat)
    return attn + mlp


# ------------------------------------------------------------------ one forward


@dataclass(frozen=True)
class ForwardCost:
    """Seconds of one forward and its terms (``compute`` and ``memory`` overlap: the larger counts)."""

    compute: float
    memory: float
    comm: float
    overhead: float

    @property
    def seconds(self) -> float:
        return max(self.compute, self.memory) + self.comm + self.overhead

    @property
    def bound(self) -> str:
        return "compute" if self.compute >= self.memory else "memory"


def forward_cost(
    m: ModelShape, hw: Hardware, gen: Gen, rows: float, q: float, context: float, overhead: float = 0.0
) -> ForwardCost:
    """One forward of ``rows`` rows × ``q`` new tokens over ``context`` cached tokens (summed over
    rows) on a replica of gen.tp GPUs (module doc for each term)."""
    tokens = rows * q
    if tokens <= 0:
        return ForwardCost(0.0, 0.0, 0.0, 0.0)
    flops = linear_flops(m, tokens) + attention_flops(m, q, context)
    nbytes = weight_bytes_per_gpu(m, tokens, gen.tp, gen.ep) + kv_bytes_per_token(m) * (context + tokens) * kv_shard(
        m, gen.tp
    )
    compute = flops / (gen.tp * hw.flops * hw.flops_efficiency)
    memory = nbytes / (hw.hbm_bandwidth * hw.bandwidth_efficiency)
    return ForwardCost(compute, memory, comm_s(m, hw, gen, tokens), overhead)


def kv_capacity_tokens(
    m: ModelShape, hw: Hardware, gen: Gen, extra_weights: float = 0.0, extra_kv_per_token: float = 0.0
) -> float:
    """Tokens of KV cache a replica holds: tp · HBM · memory_utilization − weights (target and
    drafter), over the KV bytes per token (target and drafter)."""
    free = gen.tp * hw.hbm_bytes * gen.memory_utilization - weight_bytes_resident(m) - extra_weights
    return max(free, 0.0) / gen.tp / (kv_bytes_per_token(m) * kv_shard(m, gen.tp) + extra_kv_per_token / gen.tp)


# ------------------------------------------------------------------ outside the forward


def sampler_s(hw: Hardware, positions: float, vocab: int, bytes_per_entry: float) -> float:
    """Seconds of the sampler's memory traffic for ``positions`` sampled positions over a ``vocab``-entry
    vocabulary: positions · vocab · bytes_per_entry / (bandwidth · bandwidth_efficiency). vLLM samples
    every position the target scores (B · (k + 1) in a verification, B in a decode) from fp32 logits in
    separate kernels, each reading and writing [positions, vocab] (bytes_per_entry counted in the
    scenario); every tensor-parallel rank samples the full vocabulary, so no split over tp."""
    if positions <= 0 or bytes_per_entry <= 0:
        return 0.0
    return positions * vocab * bytes_per_entry / (hw.hbm_bandwidth * hw.bandwidth_efficiency)


def ngram_scan_s(context: float, rows: float, ns_per_token: float, threads: int) -> float:
    """Host seconds of vLLM's n-gram proposer in one step: it runs a KMP scan over each live row's
    whole token sequence (``_find_longest_matched_ngram_and_propose_tokens``, O(context) per row), rows
    spread over ``threads`` numba threads (``prange`` over requests), so ns_per_token · 1e-9 · summed
    ``context`` / min(threads, rows). The GPU waits: the proposal needs the step's sampled tokens on
    the host and the next verification needs the proposal."""
    if context <= 0 or rows <= 0 or ns_per_token <= 0:
        return 0.0
    return ns_per_token * 1e-9 * context / max(min(float(threads), rows), 1.0)
