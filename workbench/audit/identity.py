"""`wb audit --identity`: plain and speculative decoding with the same row seeds, compared token for token.

Under ``rollout.sampler=keyed`` (:mod:`workbench.rollout.keyed`) the token at completion position t of
a row is the keyed two-level Gumbel-max sample (a block of BLOCK ids b by S(b) = log P_t(b) + G(seed, t,
block b), then the token inside it by s(x) = log p_t(x) + G(seed, t, x)), in plain decoding and in
verification alike, so a speculative completion is the plain one with the same seed, whatever
the drafter and k. The one way they may part is float rounding: a 1-token forward (plain decoding) and
a (k+1)-token one (verification) round a logit differently, and where two candidates' scores are that
close the argmax can flip. After a flip the row's contexts differ, so the rest of the row differs too:
a row is judged at its first differing position only.

The tie rule. At a row's first differing position the common prefix is teacher-forced through the
target once more (a third forward, the reference) and the two candidates a (plain's) and b
(speculative's) are scored there. With logits z, temperature T and the target's compute dtype's
epsilon eps, the tolerance is

    tol = 2 * TIE_ULPS * eps * max(1, max_x |z_x|) / T        (greedy: without the / T)

in score units (nats): each arm's logits lie within delta = TIE_ULPS * eps * max|z| of the reference's
(measured on ``tiny``, float32: a 1-token, a 4-token and a whole-sequence forward differ by at most
16 such ulps, 3.2e-5 at max |z| = 16.7; TIE_ULPS = 64 leaves 4x), so a flip bounds the reference's
gap by 2 delta / T (a block's log P is a log-sum-exp of its logits / T: the same bound). For candidates
in one block the position is a tie when (score) |s(a) - s(b)| <= tol, or (edge) one candidate sits on
the top-k / top-p support's edge (its logit within tol of the k-th, or the mass before it within tol of
top_p, so a forward's rounding can keep or drop it) and the other is the best of the block's rest
within tol; for candidates in two blocks, when (score) |S(block a) - S(block b)| <= tol, or (edge) the
order of the two blocks flips between the support with and without its edge tokens. Anything else is
a real difference; so is every difference under ``rollout.sampler=rejection``, which is not
drafter-invariant (nothing to score: the check's teeth).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from workbench.audit.engines import EngineOptions, build_engine
from workbench.rollout.config import EngineConfig
from workbench.rollout.keyed import BLOCK, block_uniform, derive_seed, gumbel, keyed_uniform
from workbench.rollout.sampling import SamplingParams, probs_from_logits
from workbench.rollout_builder import plain_backend

TIE_ULPS = 64  # each arm's logits within this many ulps of max |z| of the reference forward's
MAX_CHECKED = 256  # differing rows whose first divergence is scored (the rest count as real differences)
SEED_KEY = 0x1D  # the audit's row seeds: derive_seed(run seed, SEED_KEY, prompt, sample) when none are given


@dataclass(frozen=True)
class Comparison:
    """Two arms' completions compared row by row (same prompts, same order).

    rows, tokens: compared (a row's tokens: the longer arm's length); differing_tokens: positions where
    the tokens differ plus the difference in length; first: (row, first differing position) per
    differing row."""

    rows: int
    tokens: int
    differing_tokens: int
    first: tuple[tuple[int, int], ...]

    @property
    def differing_rows(self) -> int:
        return len(self.first)


def compare(plain: list[list[int]], spec: list[list[int]]) -> Comparison:
    """Compare completions row by row (pure).

    Raises:
        ValueError: the arms have different numbers of rows.
    """
    if len(plain) != len(spec):
        raise ValueError(f"identity: {len(plain)} plain rows against {len(spec)} speculative ones")
    tokens = differing = 0
    first = []
    for i, (a, b) in enumerate(zip(plain, spec)):
        tokens += max(len(a), len(b))
        n = min(len(a), len(b))
        diff = [t for t in range(n) if a[t] != b[t]]
        differing += len(diff) + abs(len(a) - len(b))
        if diff or len(a) != len(b):
            first.append((i, diff[0] if diff else n))
    return Comparison(len(plain), tokens, differing, tuple(first))


def tie_tolerance(logits: torch.Tensor, temperature: float, dtype: torch.dtype) -> float:
    """The tie rule's tolerance in score units (module doc): 2 TIE_ULPS eps max(1, max|z|) / T."""
    tol = 2 * TIE_ULPS * torch.finfo(dtype).eps * max(1.0, float(logits.abs().max()))
    return tol / temperature if temperature > 0 else tol


def support_edge(zt: torch.Tensor, sp: SamplingParams, tol: float) -> torch.Tensor:
    """(V,) bool: tokens whose membership of the top-k / top-p support a rounding of ``tol`` (score
    units) can flip; ``zt`` (V,) float64 logits / T."""
    V = zt.numel()
    edge = torch.zeros(V, dtype=torch.bool)
    if 0 < sp.top_k < V:
        kth = torch.topk(zt, sp.top_k).values[-1]
        edge |= (zt - kth).abs() <= tol
        zt = zt.masked_fill(zt < kth, float("-inf"))
    if sp.top_p < 1.0:
        srt, idx = torch.sort(zt, descending=True)
        p = srt.softmax(-1)
        before = p.cumsum(-1) - p  # the mass strictly before each token, as probs_from_logits drops
        edge[idx[((before - sp.top_p).abs() <= tol) & (p > 0)]] = True
    return edge


def _block_scores(zt: torch.Tensor, keep: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """(nb,) S(b) = log-sum-exp of ``zt`` over the kept tokens of block b, plus the block's Gumbel noise."""
    nb = noise.numel()
    z = torch.nn.functional.pad(zt.masked_fill(~keep, float("-inf")), (0, nb * BLOCK - zt.numel()), value=float("-inf"))
    return z.view(nb, BLOCK).logsumexp(-1) + noise


def classify(logits: torch.Tensor, sp: SamplingParams, seed: int, pos: int, a: int, b: int, dtype: torch.dtype):
    """Whether candidates ``a`` (plain's) and ``b`` (speculative's) tie at a keyed position (module doc).

    logits: (V,) the reference forward's raw logits; seed: the row's; pos: the completion position.
    Returns (gap, tol, tie): gap = s(a) - s(b) in score units (greedy: z_a - z_b; two blocks: S(block a) -
    S(block b)), tol the tolerance, tie "score", "edge" or "" (not a tie)."""
    z = logits.detach().double().cpu()
    tol = tie_tolerance(z, sp.temperature, dtype)
    if sp.greedy:
        gap = float(z[a] - z[b])
        return gap, tol, "score" if abs(gap) <= tol else ""
    zt, key = z / sp.temperature, (torch.tensor([seed]), torch.tensor([[pos]]))
    support = probs_from_logits(logits.detach().float().cpu(), sp) > 0
    edge = support_edge(zt, sp, tol)
    if a // BLOCK != b // BLOCK:
        noise = gumbel(block_uniform(*key, -(-z.numel() // BLOCK)))[0, 0]  # (nb,)
        S = _block_scores(zt, support, noise)
        gap = float(S[a // BLOCK] - S[b // BLOCK])
        if abs(gap) <= tol:
            return gap, tol, "score"
        S_in, S_out = _block_scores(zt, support | edge, noise), _block_scores(zt, support & ~edge, noise)
        flips = [float(v[a // BLOCK] - v[b // BLOCK]) for v in (S_in, S_out)]
        return (
            gap,
            tol,
            "edge" if bool(edge.any()) and (flips[0] * flips[1] <= 0 or min(map(abs, flips)) <= tol) else "",
        )
    u = keyed_uniform(*key, z.numel())[0, 0]  # (V,)
    s = torch.where(support | edge, zt + gumbel(u), float("-inf"))  # keyed scores, up to log Z
    gap = float(s[a] - s[b])
    if abs(gap) <= tol:
        return gap, tol, "score"
    block = (torch.arange(z.numel()) // BLOCK) == a // BLOCK
    for x, y in ((a, b), (b, a)):
        if bool(edge[x]):
            rest = s.masked_fill(~block, float("-inf"))
            rest[x] = float("-inf")
            if float(rest.max()) - float(s[y]) <= tol:
                return gap, tol, "edge"
    return gap, tol, ""


@dataclass(frozen=True)
class Divergence:
    """A differing row's first differing position: the two tokens (-1: the arm's row ended there) and,
    under keyed sampling, the reference's score gap, its tolerance and the tie kind ("" = not a tie)."""

    row: int
    pos: int
    plain: int
    spec: int
    gap: float | None = None
    tol: float | None = None
    tie: str = ""

    def describe(self) -> str:
        what = {"score": "a float tie", "edge": "a float tie at the support's edge", "": "not a tie"}[self.tie]
        if self.gap is None:
            what += " (unscored: the rejection sampler, a row's end or past MAX_CHECKED rows)"
        score = f", score gap {self.gap:.2e} (tolerance {self.tol:.1e})" if self.gap is not None else ""
        return f"row {self.row} position {self.pos}: plain {self.plain}, speculative {self.spec}{score}: {what}"


@torch.no_grad()
def divergences(
    target, prompts: list[list[int]], plain: list[list[int]], spec: list[list[int]], cmp: Comparison, sp
) -> list[Divergence]:
    """Each differing row's first divergence, scored by the tie rule (keyed sampling with row seeds; at
    most MAX_CHECKED rows, the rest unscored and so not ties)."""
    dev = target.lm_head.weight.device
    dtype = target.lm_head.weight.dtype
    out = []
    for n, (i, t) in enumerate(cmp.first):
        a = plain[i][t] if t < len(plain[i]) else -1
        b = spec[i][t] if t < len(spec[i]) else -1
        if not sp.keyed or sp.seeds is None or a < 0 or b < 0 or n >= MAX_CHECKED:
            out.append(Divergence(i, t, a, b))
            continue
        ctx = torch.tensor([prompts[i] + plain[i][:t]], device=dev)
        L = ctx.shape[1]
        logits, _ = target(
            ctx,
            torch.zeros(1, dtype=torch.long, device=dev),
            target.new_cache(1, L + 1),
            logits_col=torch.tensor([L - 1], device=dev),
        )
        gap, tol, tie = classify(logits[0, -1], sp, int(sp.seeds[i]), t, a, b, dtype)
        out.append(Divergence(i, t, a, b, gap, tol, tie))
    return out


@dataclass
class IdentityReport:
    """One drafter's identity check: the comparison, each differing row's first divergence, the
    speculative arm's acceptance (accepted / drafted tokens: whether the accept path ran)."""

    drafter: str
    k: int
    sampler: str
    comparison: Comparison
    divergences: list[Divergence]
    acceptance: float
    wall_s: float = 0.0

    @property
    def ties(self) -> int:
        return sum(1 for d in self.divergences if d.tie)

    @property
    def passed(self) -> bool:
        """Identical up to counted ties: every differing row parts at a float tie."""
        return self.ties == self.comparison.differing_rows

    def summary(self) -> str:
        c = self.comparison
        return (
            f"{self.drafter} k={self.k} ({self.sampler}): {c.rows} rows, {c.tokens} tokens compared; "
            f"{c.differing_rows} rows, {c.differing_tokens} tokens differ; {self.ties} ties; "
            f"acceptance {self.acceptance:.2f}"
        )


def grpo_groups(prompts: list[list[int]], group_size: int) -> tuple[list[list[int]], list[int]]:
    """Each prompt ``group_size`` times, groups contiguous, and the rows' group ids (as a GRPO step's rows)."""
    rows = [p for p in prompts for _ in range(group_size)]
    return rows, [g for g in range(len(prompts)) for _ in range(group_size)]


def with_row_seeds(sp: SamplingParams, n: int, seed: int, group_size: int = 1) -> SamplingParams:
    """``sp`` with one seed per row under keyed sampling (row i: prompt i // group_size, sample
    i % group_size), unchanged otherwise or when seeds are given."""
    if not sp.keyed or sp.seeds is not None:
        return sp
    return replace(sp, seeds=tuple(derive_seed(seed, SEED_KEY, i // group_size, i % group_size) for i in range(n)))


def plain_completions(target, prompts, sp: SamplingParams, batch: int, seed: int = 0, group_ids=None):
    """The plain arm: autoregressive decoding of ``prompts`` (``batch`` rows at a time, rows joining as
    others finish), the torch generator seeded with ``seed`` (what the rejection sampler draws from)."""
    gen = torch.Generator(target.lm_head.weight.device).manual_seed(seed)
    return plain_backend(target, EngineConfig(max_batch_size=batch)).generate(prompts, sp, gen, group_ids).tokens


def run_identity(
    target,
    drafter,
    prompts: list[list[int]],
    sp: SamplingParams,
    k: int,
    batch: int,
    *,
    name: str = "",
    group_ids: list[int] | None = None,
    seed: int = 0,
    plain: list[list[int]] | None = None,
    engine: EngineOptions | None = None,
) -> IdentityReport:
    """Plain against speculative decoding (``drafter`` at ``k``) of ``prompts`` with the same row seeds
    (``sp.seeds``; keyed sampling needs them given, :func:`with_row_seeds`) and the same torch seed.

    batch: rows decoded together in both arms (continuous batching past it); group_ids: the rows'
    prompts (prefix sharing, as a GRPO step); plain: the plain arm's completions if already decoded;
    engine: adaptive k, retire buckets, compile for the speculative arm.

    Raises:
        ValueError: keyed sampling without one seed per row.
    """
    if sp.keyed and (sp.seeds is None or len(sp.seeds) != len(prompts)):
        raise ValueError("identity: keyed sampling needs one seed per row (SamplingParams.seeds; with_row_seeds)")
    t0 = time.perf_counter()
    if plain is None:
        plain = plain_completions(target, prompts, sp, batch, seed, group_ids)
    eng = build_engine(target, drafter, k, batch, len(prompts), engine or EngineOptions())
    out = eng.generate(prompts, sp, torch.Generator(target.lm_head.weight.device).manual_seed(seed), group_ids)
    cmp = compare(plain, out.tokens)
    divs = divergences(target, prompts, plain, out.tokens, cmp, sp)
    c = out.counters
    acc = c.num_accepted_tokens / max(c.num_draft_tokens, 1)
    return IdentityReport(name, k, sp.sampler, cmp, divs, acc, time.perf_counter() - t0)
