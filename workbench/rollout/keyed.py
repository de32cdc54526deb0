"""Drafter-invariant sampling: each completion token is a fixed function of (row seed, position, p).

Daliri, Musco and Suresh 2024, "Coupling without communication and drafter-invariant speculative
decoding" (arXiv 2408.07978). The token at completion position t of a row is the keyed Gumbel-max
sample of the processed distribution p_t (temperature, top-k, top-p applied first,
:mod:`workbench.rollout.sampling`), taken in two levels over blocks of BLOCK consecutive token ids:

    b_t = argmax_b  log P_t(b) + G_{seed, t}(block b),     P_t(b) = sum of p_t over block b
    x_t = argmax_{x in b_t}  log p_t(x) + G_{seed, t}(x),  G = -log(-log u),  u = hash(seed, t, id) in (0, 1)

with noise keyed by the row's seed and the position, never by how many forwards ran before. Each level
is an exact Gumbel-max sample, so P(x_t = x) = P_t(b) p_t(x) / P_t(b) = p_t(x); the two levels hash
V / BLOCK + BLOCK keys a position instead of V (96 + 512 for SmolLM2's 49,152 ids: one flat hash over
the vocabulary made keyed verification at 64 rows, k = 3, cost more than the model's forward on the
2-core CPU). With V <= BLOCK (the embedded presets' 512 ids) there is one block and the sample is the flat
Gumbel-max one. Two levels couple a little less well than one (the coupled draft below loses at each), so
BLOCK is as large as keeps the hashing cheap. Plain decoding emits x_t; speculative verification accepts
draft d_t iff d_t == x_t and emits x_t at the first mismatch (the correction) or after k accepted drafts
(the bonus). Model drafters draft with the same keyed noise (:func:`coupled_draft`, the coupled draft
of the paper) or by argmax. So speculative output is token-for-token plain output with the same seeds, whatever the
drafter and k (up to float ties between a 1-token and a (k+1)-token forward). The noise of distinct
(t, id) is independent, so a completion's law is the target's. For a deterministic draft d,
P(accept) = p_t(d), as Leviathan et al.'s rejection sampling with q = one-hot(d).

The uniforms come from a counter-based hash (the splitmix64 finaliser, Steele et al. 2014) of
(seed, t, token or block id) in int64 arithmetic on the device: vectorised over rows, positions and
ids, no generator state and no Python loop over rows. Right shifts are made logical by a mask
(torch's ``>>`` on int64 is arithmetic); multiplication wraps modulo 2^64.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from workbench.rollout.sampling import SamplingParams

_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers as signed int64 (same low 64 bits)
_M2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # the Weyl increment that separates consecutive counters
_POS = 0xD1B54A32D192ED03 - (1 << 64)  # odd constants spreading positions and token ids
_TOK = 0xAEF17502108EF2D9 - (1 << 64)
_BLOCKS = 0x632BE59BD9B4E019  # separates the block level's keys from the token level's
_MASK64 = (1 << 64) - 1
BLOCK = 512  # token ids per block of the two-level sample (module doc); the presets' 512 ids are one block


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` by ``s`` bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix64_(z: torch.Tensor) -> torch.Tensor:
    """:func:`mix64` in place on ``z`` (one scratch tensor): the hashes over (rows, positions, ids) are
    the keyed sample's largest cost, and a fresh tensor per operation doubles it at (64, 4, 512)."""
    t = torch.empty_like(z)
    for s, m in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, s, out=t)
        z ^= t.bitwise_and_((1 << (64 - s)) - 1)
        if m is not None:
            z *= m
    return z


def mix64(z: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser, elementwise on an int64 tensor (a bijection of 64-bit words)."""
    return _mix64_(z.clone())


def _position_key(seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 keys of (row seed (B,), completion position (B, T))."""
    return _mix64_(_mix64_(seed.long() + _GOLDEN)[:, None] + pos.long() * _POS)


def _uniform(key: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1), float64, of ``key`` (B, T) and ``ids`` broadcast against (B, T, n): the top 53
    bits of the hash, plus half a step."""
    bits = _shr(_mix64_(key[..., None] ^ (ids.long() * _TOK)), 11)  # (B, T, n) in [0, 2^53)
    return (bits.double() + 0.5) * 2.0**-53


def keyed_uniform(seed: torch.Tensor, pos: torch.Tensor, vocab: int | torch.Tensor) -> torch.Tensor:
    """The token level's uniforms, keyed by (seed, position, token id).

    Args:
        seed: (B,) int64 row seeds.
        pos: (B, T) int64 completion positions (0 = the first completion token).
        vocab: V, the number of token ids (ids 0..V-1), or a (V,) long tensor of the token ids to key.
    Returns:
        (B, T, V) float64, strictly inside (0, 1).
    """
    ids = torch.arange(vocab, device=seed.device) if isinstance(vocab, int) else vocab.to(seed.device)
    return _uniform(_position_key(seed, pos), ids)


def block_uniform(seed: torch.Tensor, pos: torch.Tensor, blocks: int) -> torch.Tensor:
    """The block level's uniforms, keyed by (seed, position, block index): (B, T, blocks) float64."""
    key = _mix64_(_position_key(seed, pos) + _BLOCKS)
    return _uniform(key, torch.arange(blocks, device=seed.device))


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise -log(-log u) of uniforms u in (0, 1)."""
    return -(-u.log()).log()


def _exp_noise(key: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T, n) float32 Exp(1) noise E = -log u of :func:`_uniform`'s 53-bit u (``key`` (B, T), ``ids``
    broadcast against (B, T, n)). The logarithm is taken in float64 and rounded to float32, so E keeps
    float32's relative precision at every size: from 24-bit uniforms the smallest E, the likeliest
    winners of the race, would be quantised at 2^-24."""
    h = _mix64_(key[..., None] ^ (ids.long() * _TOK))  # (B, T, n)
    h = torch.bitwise_right_shift(h, 11, out=h).bitwise_and_((1 << 53) - 1)
    return h.double().add_(0.5).mul_(2.0**-53).log_().neg_().float()


def _race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of weights / noise: the exponential race, Gumbel-max in product form
    (argmax log w + G = argmax w / E, G = -log E, E ~ Exp(1)): one logarithm per id, none of w. Weight 0
    never wins (E > 0)."""
    return (weights.float() / noise).argmax(-1)


def keyed_sample(probs: torch.Tensor, seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The keyed two-level Gumbel-max sample of each processed distribution (module doc), computed as
    exponential races (:func:`_race`); the flat one-level race when V <= BLOCK.

    Args:
        probs: (B, T, V) processed distributions p (zeros where top-k/top-p removed a token; greedy
            one-hot gives the argmax); rows need not be normalised.
        seed: (B,) int64 row seeds.
        pos: (B, T) int64 completion position of each distribution.
    Returns:
        (B, T) int64 token ids. Tokens with p = 0 are never chosen.
    """
    B, T, V = probs.shape
    key = _position_key(seed, pos)  # (B, T)
    if V <= BLOCK:
        return _race(probs, _exp_noise(key, torch.arange(V, device=probs.device)))
    nb = -(-V // BLOCK)
    p = probs if V == nb * BLOCK else torch.nn.functional.pad(probs, (0, nb * BLOCK - V))  # no copy when whole
    p = p.reshape(B, T, nb, BLOCK)  # (B, T, nb, BLOCK); a view unless probs' last dim is strided
    blk = _race(p.sum(-1), _exp_noise(_mix64_(key + _BLOCKS), torch.arange(nb, device=probs.device)))  # (B, T)
    inside = p.gather(2, blk[..., None, None].expand(B, T, 1, BLOCK))[:, :, 0]  # (B, T, BLOCK)
    ids = blk[..., None] * BLOCK + torch.arange(BLOCK, device=probs.device)  # (B, T, BLOCK)
    return blk * BLOCK + _race(inside, _exp_noise(key, ids))


def coupled_draft(
    q: torch.Tensor, seed: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The coupled draft of Daliri et al.: the drafter's keyed sample under the target's keyed noise.

    :func:`keyed_sample` of q at the drafted position: the same noise the target's keyed sample there
    uses, so the draft equals the target's token with probability at least (1 - TV) / (1 + TV) at each
    of the two levels (their coupling bound; TV = TV(p, q) over blocks, then inside the block), where an
    argmax draft is accepted with p(argmax q) only.

    Args:
        q: (B, V') processed draft distributions.
        seed: (B,) int64 row seeds.
        pos: (B,) long completion position of the drafted token.
        ids: (V',) long target token id of each column of q (a reduced draft vocabulary), or None (V' = V):
            the columns are keyed, and blocked, by the ids they stand for.
    Returns:
        (B,) long column indices into q.
    """
    if ids is None:
        return keyed_sample(q[:, None], seed, pos[:, None])[:, 0]
    ids = ids.to(q.device)
    full = q.new_zeros(q.shape[0], int(ids.max()) + 1).index_copy_(1, ids, q)  # (B, max id + 1)
    column = torch.full((full.shape[1],), -1, dtype=torch.long, device=q.device).index_copy_(
        0, ids, torch.arange(ids.numel(), device=q.device)
    )
    return column[keyed_sample(full[:, None], seed, pos[:, None])[:, 0]]


def keyed_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    seed: torch.Tensor,
    pos0: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify k drafts per row by the keyed sample (drafter-invariant speculative decoding).

    Args:
        target_probs: (B, k+1, V) processed target distribution at the k draft positions and the bonus one.
        draft_tokens: (B, k) long drafts (values past ``num_draft`` are ignored).
        num_draft: (B,) long real drafts per row, 0..k.
        seed: (B,) int64 row seeds.
        pos0: (B,) long completion position of column 0 (the first draft's position).
    Returns:
        num_accepted: (B,) long, the leading drafts equal to the keyed sample at their position.
        tokens: (B, k+1) long, the keyed samples; row b emits ``tokens[b, :n_b + 1]`` (its accepted
            drafts, which equal them, then the correction or the bonus token), as
            :func:`workbench.rollout.rejection.rejection_sample` returns.
    """
    B, k1, _ = target_probs.shape
    cols = torch.arange(k1, device=target_probs.device)
    keyed = keyed_sample(target_probs, seed, pos0[:, None] + cols[None, :])  # (B, k+1)
    is_draft = cols[None, : k1 - 1] < num_draft[:, None]  # (B, k)
    accept = (draft_tokens == keyed[:, : k1 - 1]) & is_draft
    return accept.long().cumprod(-1).sum(-1), keyed


def derive_seed(*parts: int) -> int:
    """A row seed in [0, 2^63) from integers (run seed, step, prompt index, sample index, ...): the
    splitmix64 finaliser folded over the parts, so every tuple gets its own well-mixed stream."""
    h = 0
    for x in parts:
        z = (h + int(x) * (_GOLDEN & _MASK64) + (_GOLDEN & _MASK64)) & _MASK64
        z = ((z ^ (z >> 30)) * (_M1 & _MASK64)) & _MASK64
        z = ((z ^ (z >> 27)) * (_M2 & _MASK64)) & _MASK64
        h = z ^ (z >> 31)
    return h >> 1


def row_seeds(seeds: tuple[int, ...] | None, n: int, generator: torch.Generator | None) -> tuple[int, ...]:
    """The n rows' seeds: ``seeds`` as given (one per row), or drawn from ``generator`` when None
    (reproducible with the run's stream, fresh per call; the paired twin then needs seeds given).

    Raises:
        ValueError: ``seeds`` given with a length other than n.
    """
    if seeds is None:
        dev = generator.device if generator is not None else "cpu"
        return tuple(torch.randint(0, 2**62, (n,), generator=generator, device=dev).tolist())
    if len(seeds) != n:
        raise ValueError(f"rollout.sampler=keyed: {len(seeds)} seeds for {n} prompts (SamplingParams.seeds: one a row)")
    return tuple(int(s) for s in seeds)


def seeded(
    sp: SamplingParams, *key: int, group_ids: list[int], group_size: int, first_group: int = 0
) -> SamplingParams:
    """``sp`` with one seed per row under keyed sampling (unchanged otherwise): row i of a GRPO batch
    (groups contiguous, ``group_ids[i]`` its prompt, ``i % group_size`` its sample) gets
    ``derive_seed(*key, first_group + group_ids[i], i % group_size)``, ``key`` e.g. (run seed, step).
    So a run is reproducible and its paired plain twin decodes the very same seeds."""
    if not sp.keyed:
        return sp
    seeds = tuple(derive_seed(*key, first_group + g, i % group_size) for i, g in enumerate(group_ids))
    return replace(sp, seeds=seeds)
