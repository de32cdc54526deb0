"""The exact law of the first two completion tokens as chi-square cells, at any vocabulary size.

The audit's joint test (package docstring, (b)) compares the observed pairs (x0, x1) with the
enumerated law p(x0) p(x1 | x0), rows that stop at x0 (eos or any other stop id) excluded.
Enumerated densely that is a V x V table and one teacher-forced row per first token of non-zero
probability: fine for the embedded models (V of a few hundred), impossible for a real vocabulary
(SmolLM2's V = 49,152: a 19 GB float64 table and a 49k-row forward at T 0.7 / top-p 1, where
every token has p > 0).

So the cells are split by what the test can use. With n rows, a first token v whose whole row of
cells expects fewer than ``min_expected`` observations (n p(v) < 5) has every cell of its row
pooled by the chi-square anyway; here its row is one cell, (v, any x1), with probability p(v),
known exactly from the prefill without a forward. Only the first tokens with n p(v) >= 5 (at most
n / 5 of them; a handful at an informative context) are teacher-forced and kept cell by cell.
Nothing is approximated: the cells are a coarsening of the exact law, and a token the target gives
probability 0 at x0 still has a cell of expectation 0 (a sample there fails the test at once).
Where the dense table is small (``max_cells``) it is kept whole, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workbench.rollout.sampling import SamplingParams, probs_from_logits


@dataclass(frozen=True)
class Joint2:
    """The law of (x0, x1) given x0 is no stop id, as cells.

    first: (S,) long, the first tokens teacher-forced; rows: (S, V) float64, p(x0 = first[i],
    x1 = v); rest: (V,) float64, p(x0 = v) for every other first token, one pooled cell each (0
    for those in ``first``). Cell probabilities sum to 1.
    """

    first: torch.Tensor
    rows: torch.Tensor
    rest: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.rest.numel()

    def probs(self) -> torch.Tensor:
        """(S·V + V,) float64 cell probabilities: the kept rows flattened, then the pooled rows."""
        return torch.cat([self.rows.flatten(), self.rest])

    def observed(self, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
        """(S·V + V,) float64 counts of the pairs (x0, x1) (each (N,) long) in the same cells.

        Raises:
            ValueError: x0 and x1 of different lengths or a token outside the vocabulary.
        """
        V, S = self.vocab_size, self.first.numel()
        if x0.shape != x1.shape:
            raise ValueError(f"Joint2.observed: x0 {tuple(x0.shape)} and x1 {tuple(x1.shape)} differ")
        if x0.numel() and (int(x0.min()) < 0 or int(x0.max()) >= V or int(x1.min()) < 0 or int(x1.max()) >= V):
            raise ValueError(f"Joint2.observed: token ids must lie in [0, {V})")
        slot = torch.full((V,), -1, dtype=torch.long)
        slot[self.first.cpu()] = torch.arange(S)
        s = slot[x0.cpu()]  # (N,) the kept row of each pair, -1 = pooled
        kept = s >= 0
        cells = torch.where(kept, s * V + x1.cpu(), S * V + x0.cpu())  # (N,)
        return torch.bincount(cells, minlength=S * V + V).double()


def stop_tuple(stop_ids: int | Sequence[int] | None) -> tuple[int, ...]:
    """The ids that end a row, given as one id, several (``SamplingParams.stop_ids``) or None (none)."""
    return () if stop_ids is None else (stop_ids,) if isinstance(stop_ids, int) else tuple(stop_ids)


@torch.no_grad()
def exact_joint2(
    target,
    prompt: list[int],
    sp: SamplingParams,
    stop_ids: int | Sequence[int] | None,
    n: int | None = None,
    min_expected: float = 5.0,
    max_cells: int = 1 << 22,
    chunk: int = 256,
) -> Joint2:
    """The exact law of the first two completion tokens of ``prompt`` given x0 is no stop id (renormalised).

    target: a LeanLM; sp: the audited sampling (temperature/top-k/top-p applied to both tokens).
    stop_ids: the ids that end a row at x0, one id or several (the audit passes ``sp.stop_ids``:
    eos and every other stop id, as the engines stop); None or empty: none.
    n: the rows the test will see; first tokens with n·p(x0) < ``min_expected`` are pooled into one
    cell each (module docstring). None, or a dense table of at most ``max_cells`` cells: every first
    token of non-zero probability is kept. At most ``max_cells`` // V first tokens are kept (the
    most probable). chunk: first tokens per teacher-forced forward (memory: chunk x V logits).
    """
    P = len(prompt)
    dev = target.lm_head.weight.device
    base = target.new_cache(1, P + 2)
    logits0, _ = target(
        torch.tensor([prompt], device=dev),
        torch.zeros(1, dtype=torch.long, device=dev),
        base,
        logits_col=torch.tensor([P - 1], device=dev),
    )
    p0 = probs_from_logits(logits0[0, 0], sp).double()  # (V,)
    p0[torch.tensor(stop_tuple(stop_ids), dtype=torch.long, device=dev)] = 0.0  # a row stopped at x0 has no x1
    total = float(p0.sum())
    V = p0.numel()
    support = p0.nonzero().flatten()  # (U,)
    if n is not None and support.numel() * V > max_cells:
        support = support[p0[support] * n >= min_expected]
    cap = max(max_cells // V, 1)
    if support.numel() > cap:
        support = support[p0[support].topk(cap).indices]
    support = support.sort().values  # (S,)
    rows = torch.zeros(support.numel(), V, dtype=torch.float64, device=dev)
    for i in range(0, support.numel(), chunk):
        s = support[i : i + chunk]
        cache = target.new_cache(1, P + 2, capacity=s.numel())
        for dst, src in zip(cache.k + cache.v, base.k + base.v):
            dst.copy_(src)  # the prompt's entries
        cache.select(torch.zeros(s.numel(), dtype=torch.long, device=dev))  # (1, ...) -> (c, ...) in place
        logits1, _ = target(s[:, None], torch.full((s.numel(),), P, device=dev), cache)  # (c, 1, V)
        rows[i : i + s.numel()] = p0[s, None] * probs_from_logits(logits1[:, 0], sp).double()
    rest = p0.clone()
    rest[support] = 0.0
    return Joint2(support.cpu(), (rows / total).cpu(), (rest / total).cpu())
