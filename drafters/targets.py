"""What a drafter learns from: the target's next-token logits at every position, kept whole
(..., V) for small vocabularies or as their top K (:class:`TopKLogits`) for large ones, and the
losses over either form (soft cross-entropy, forward KL, top-1 agreement).

Why top K: a stored row of full logits costs L * V * 4 bytes — 35 MB for 180 positions of a 49k
vocabulary (SmolLM2), 18 GB for 512 drafter-init sequences — and a (16, 180, 49k) training batch
moves 0.6 GB per step through every loss, while the drafter's loss needs only the head of each
distribution. Sparse top-K logit distillation (Raman et al. 2023, "For distillation, tokens are not
all you need"; Anshumann et al. 2025, arXiv 2503.16870) keeps the K largest logits and renormalises
over them; the argmax (top-1 agreement) is kept exactly. This changes what a drafter learns from,
never what rollouts follow: the rejection sampler uses the drafter's q as proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

TOPK_MIN_VOCAB = 8192  # vocabularies larger than this keep only the target's top-K logits per position
TOPK = 256
TAIL_GAP = 30.0  # densified: logits outside the top K sit this far below the K-th (exp(-30) * 49k ~ 5e-9 of the mass)


@dataclass
class TopKLogits:
    """Target logits kept as their top K per position: ``values`` (..., K) float32, sorted
    descending, and ``indices`` (..., K) long into a vocabulary of ``vocab_size``. Leading dims
    are a row's (L,) or a batch's (N, L); indexing applies to them."""

    values: torch.Tensor
    indices: torch.Tensor
    vocab_size: int

    @classmethod
    def of(cls, logits: torch.Tensor, k: int = TOPK) -> "TopKLogits":
        """(..., V) logits -> their top ``k`` per position."""
        v, i = logits.float().topk(min(k, logits.shape[-1]), dim=-1)  # sorted: column 0 is the argmax
        return cls(v, i, logits.shape[-1])

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.values.shape[:-1], self.vocab_size)

    def __getitem__(self, idx) -> "TopKLogits":
        return TopKLogits(self.values[idx], self.indices[idx], self.vocab_size)

    def dense(self) -> torch.Tensor:
        """(..., V) float32 logits: the kept ones, everything else ``TAIL_GAP`` below each
        position's K-th (finite, so a softmax restricted to ids outside the top K stays defined)."""
        out = (self.values[..., -1:] - TAIL_GAP).expand(*self.shape).clone()
        return out.scatter_(-1, self.indices, self.values)


@dataclass
class DraftBatch:
    """Training data for a drafter, one row per sequence (right-padded to L).

    input_ids: (N, L) long prompt + completion.
    loss_mask: (N, L) float; 1 at positions whose next-token distribution is learned.
    target_logits: (N, L, V) float32 target logits (temperature 1) at every position, or their top K
        (:class:`drafters.targets.TopKLogits` (N, L, K)) for a large vocabulary.
    hidden: {layer: (N, L, H)} target hidden states (inputs of ``layer``; ``num_layers`` = last output).
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    target_logits: torch.Tensor | TopKLogits
    hidden: dict[int, torch.Tensor]

    def index(self, rows: torch.Tensor) -> "DraftBatch":
        return DraftBatch(
            self.input_ids[rows],
            self.loss_mask[rows],
            self.target_logits[rows],
            {i: h[rows] for i, h in self.hidden.items()},
        )


def compact(logits: torch.Tensor) -> torch.Tensor | TopKLogits:
    """Logits (..., V) as stored: whole for small vocabularies, top-K above ``TOPK_MIN_VOCAB``."""
    return TopKLogits.of(logits) if logits.shape[-1] > TOPK_MIN_VOCAB else logits


def pad_rows(rows: list[torch.Tensor | TopKLogits], length: int) -> torch.Tensor | TopKLogits:
    """Per-row logits (L_i, V) or TopKLogits (L_i, K) right-padded with zeros to ``length`` and
    stacked: (N, length, V) or TopKLogits (N, length, K). Padding is never a loss position."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, [0, 0, 0, length - t.shape[0]])

    if isinstance(rows[0], TopKLogits):
        return TopKLogits(
            torch.stack([pad(r.values) for r in rows]), torch.stack([pad(r.indices) for r in rows]), rows[0].vocab_size
        )
    return torch.stack([pad(r) for r in rows])


def extend_time(t: torch.Tensor | TopKLogits, n: int) -> torch.Tensor | TopKLogits:
    """(N, L, ...) -> (N, L + n, ...): ``n`` copies of position 0 appended (never a loss position)."""
    if isinstance(t, TopKLogits):
        return TopKLogits(extend_time(t.values, n), extend_time(t.indices, n), t.vocab_size)
    return torch.cat([t, t[:, :1].expand(t.shape[0], n, *t.shape[2:])], 1)


def temper(t: torch.Tensor | TopKLogits, temperature: float) -> torch.Tensor | TopKLogits:
    """Logits (..., V) or TopKLogits (..., K) divided by ``temperature`` (> 0): the distribution a
    drafter learns at the distillation temperature (Hinton et al. 2015; TRL's GKD divides student
    and teacher alike). The top-K order and argmax are unchanged."""
    if temperature == 1.0:
        return t
    if isinstance(t, TopKLogits):
        return TopKLogits(t.values / temperature, t.indices, t.vocab_size)
    return t / temperature


def target_argmax(t: torch.Tensor | TopKLogits) -> torch.Tensor:
    """(...) long: the target's most likely id at each position."""
    return t.indices[..., 0] if isinstance(t, TopKLogits) else t.argmax(-1)


def target_distribution(
    t: torch.Tensor | TopKLogits, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The softmax of the target logits as given (temperature 1; a loss at another temperature passes them
    through :func:`temper` first), restricted to a draft vocabulary when one is
    given (``d2t`` (Vd,) draft -> target ids and ``t2d`` (V,) target -> draft id or -1) and renormalised.

    Returns (probs, cols): dense: probs (..., Vd or V) and cols None; top-K: probs (..., K) over the
    draft-vocabulary columns ``cols`` (..., K) (zero where a kept id is outside it).
    """
    if not isinstance(t, TopKLogits):
        return F.softmax((t if d2t is None else t[..., d2t]).float(), -1), None
    v, cols = t.values.float(), t.indices
    if t2d is not None:
        cols = t2d[cols]
        v = v.masked_fill(cols < 0, float("-inf"))
        cols = cols.clamp_min(0)
    return torch.nan_to_num(F.softmax(v, -1), nan=0.0), cols  # a position whose top K all lie outside: no target


def soft_ce(draft_logits: torch.Tensor, target_probs: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
    """-sum_v p(v) log q(v) per position: draft_logits (..., V'), target_probs (..., V') or, with
    ``cols`` (..., K), (..., K) on those columns of the draft's vocabulary -> (...)."""
    logq = F.log_softmax(draft_logits.float(), -1)
    if cols is not None:
        logq = logq.gather(-1, cols)
    return -(target_probs * logq).sum(-1)


def forward_kl(
    student_logits: torch.Tensor, t: torch.Tensor | TopKLogits, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Mean KL(target_T || student_T) over masked positions (nats per token), both sides' logits
    divided by ``temperature`` T (:func:`temper`): student_logits (N, L, V), ``t`` (N, L, V) or
    TopKLogits (N, L, K), mask (N, L) -> scalar. Forward KL is mass-covering, which is what
    acceptance sum_x min(p, q) rewards (DistillSpec, Zhou et al. 2024); top-K: the target
    renormalised over its K kept ids."""
    student_logits, t = temper(student_logits, temperature), temper(t, temperature)
    if not isinstance(t, TopKLogits):
        from workbench.models.losses import forward_kl as dense_kl

        return dense_kl(student_logits, t, mask)
    t_logp = F.log_softmax(t.values.float(), -1)  # (N, L, K)
    s_logp = F.log_softmax(student_logits.float(), -1).gather(-1, t.indices)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # (N, L)
    return (kl * mask).sum() / mask.sum()
