"""`wb audit`: a statistical check that speculative rollouts follow the target's distribution.

For each drafter, the audit samples ``n`` completions of each audit prompt twice through the
rollout engine, once autoregressively and once speculatively (same :class:`SamplingParams`, short
``max_new_tokens``), and compares them (DESIGN.md §4: speculation must not change the law):

(a) per position t: the histogram of the token at t (END when the row already finished),
    speculative vs autoregressive, a two-sample chi-square test on the 2 x C contingency table;
(b) whole short sequences: the first ``joint_tokens`` tokens as one joint category, same test;
(c) greedy: temperature-0 speculative decoding must equal greedy autoregressive decoding token for
    token (deterministic, so it cannot false-alarm and is not part of the error budget).

Pooling: categories with fewer than ``min_cell`` rows over both arms are merged into one "other"
cell (expected count >= ``min_cell``/2 per arm, the chi-square approximation's usual condition);
an "other" cell that is still small is merged into the smallest kept cell.

False alarms: the m = drafters x prompts x (positions + 1) chi-square tests are Bonferroni-corrected,
each run at alpha/m, so the probability that an exact engine fails the audit is at most ``alpha``
(default 1e-3).

Power (sample size). A shift of delta in one token's probability is a 1-df contrast between the
arms (that token vs the rest). A two-sample, two-sided z-test at level a = alpha/m with power
1 - beta needs, per arm, n = (z_{1-a/2} + z_{1-beta})^2 * 2 p (1 - p) / delta^2 rows, largest at
p = 0.5 (worst case). E.g. alpha = 1e-3, m = 10, power 0.9, delta = 0.01: z = 3.89 + 1.28,
n = 26.7 * 5000 = 134k rows per arm and prompt. :func:`required_samples` computes it and the CLI
prints it, with :func:`detectable_shift` (the delta detectable at the n actually used). The
omnibus chi-square spends its power on C-1 df, so for a shift confined to one token its detectable
delta is somewhat larger than the 1-df value; both arms share the engine's batching, so
correlated errors across rows cannot hide (every row is an independent draw).

Budget: the engine prefills every row's prompt, so on a 2-core CPU the tiny target runs a few
hundred rows per second; ``max_samples`` caps n (the CLI default keeps `wb audit` under ~3 min)
and the printed detectable shift says what the capped audit can see (CLI default 12000 rows: 3.4 %).
On a GPU, lift the cap (`--max-samples 0`).

Contexts: a trained target is often certain for the first completion tokens (arith_chain restates
the expression), where every test would be vacuous (one category, p = 1). :func:`informative_prompts`
therefore extends each task prompt with the target's own sampled completion up to the first
position where the target is uncertain (most frequent token < 95 % in a small autoregressive
pilot), so the tested positions carry entropy.

A sampler can be injected (``rejection_fn``) to check that the audit catches a biased engine, e.g.
:func:`accept_all_rejection_sample`, which accepts every draft.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import torch
from scipy import stats

from drafters.base import Drafter
from workbench.rollout import engine as engine_mod
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.sampling import SamplingParams, sample

END = -1  # category: the row finished (EOS) before this position


def required_samples(alpha_test: float, power: float = 0.9, delta: float = 0.01, p: float = 0.5) -> int:
    """Rows per arm for a two-sided two-sample test at level ``alpha_test`` to detect a shift of
    ``delta`` in a probability near ``p`` with the given power (normal approximation)."""
    z = stats.norm.isf(alpha_test / 2) + stats.norm.isf(1 - power)
    return int(math.ceil(z * z * 2 * p * (1 - p) / delta**2))


def detectable_shift(n: int, alpha_test: float, power: float = 0.9, p: float = 0.5) -> float:
    """Smallest absolute probability shift detectable with ``n`` rows per arm (inverse of :func:`required_samples`)."""
    z = stats.norm.isf(alpha_test / 2) + stats.norm.isf(1 - power)
    return z * math.sqrt(2 * p * (1 - p) / max(n, 1))


def two_sample_chi2(a: Counter, b: Counter, min_cell: int = 10) -> tuple[float, int, float]:
    """Chi-square test that two samples of categories come from one law: (statistic, df, p-value).

    Rare categories (fewer than ``min_cell`` rows over both samples) are pooled. One category
    left -> (0, 0, 1.0): nothing to compare.
    """
    cats = set(a) | set(b)
    kept = sorted((c for c in cats if a[c] + b[c] >= min_cell), key=lambda c: a[c] + b[c], reverse=True)
    rare = [c for c in cats if a[c] + b[c] < min_cell]
    rows = [[a[c], b[c]] for c in kept]
    other = [sum(a[c] for c in rare), sum(b[c] for c in rare)]
    if sum(other) >= min_cell or (not rows and sum(other) > 0):
        rows.append(other)
    elif sum(other) > 0:
        rows[-1] = [rows[-1][0] + other[0], rows[-1][1] + other[1]]
    if len(rows) < 2:
        return 0.0, 0, 1.0
    res = stats.chi2_contingency(torch.tensor(rows, dtype=torch.float64).numpy(), correction=False)
    return float(res.statistic), int(res.dof), float(res.pvalue)


def position_counts(seqs: list[list[int]], t: int) -> Counter:
    return Counter(s[t] if t < len(s) else END for s in seqs)


def joint_counts(seqs: list[list[int]], j: int) -> Counter:
    return Counter(tuple(s[i] if i < len(s) else END for i in range(j)) for s in seqs)


def accept_all_rejection_sample(target_probs, draft_tokens, draft_probs, num_draft, generator=None):
    """A deliberately *wrong* verifier (accepts every real draft, bonus from p): for testing the audit."""
    B, k1, _ = target_probs.shape
    rows = torch.arange(B, device=target_probs.device)
    n = num_draft.clone()
    last = sample(target_probs[rows, n], generator)
    tokens = torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1).clone()
    tokens[rows, n] = last
    return n, tokens


@dataclass
class AuditTest:
    drafter: str
    test: str  # "pos t", "joint 0..j-1", "greedy"
    prompt: int
    pvalue: float | None  # None for the deterministic greedy check
    passed: bool
    detail: str = ""


@dataclass
class AuditResult:
    tests: list[AuditTest]
    skipped: dict[str, str]
    n: int  # rows per arm and prompt
    n_required: int  # rows per arm for a 1 % shift at p = 0.5
    alpha: float
    alpha_test: float
    num_tests: int
    shift: float  # detectable shift at n (1-df, p = 0.5, power 0.9)
    acceptance: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tests)


def informative_prompts(target, prompts: list[list[int]], sampling: SamplingParams, pilot: int = 256, scan: int = 64,
                        threshold: float = 0.95, seed: int = 0) -> list[list[int]]:
    """Each prompt + the pilot's first completion up to the first position whose most frequent token
    has frequency < ``threshold`` (the prompt unchanged if none within ``scan`` tokens)."""
    sp = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, scan, sampling.eos_token_id)
    eng = RolloutEngine(target, None, max_batch_size=pilot)
    out = []
    for i, p in enumerate(prompts):
        seqs = eng.generate([p] * pilot, sp, torch.Generator(eng.device).manual_seed(seed + 7 * i)).tokens
        t0 = 0
        for t in range(scan):
            c = position_counts(seqs, t)
            if c.most_common(1)[0][1] < threshold * pilot:
                t0 = t
                break
        row = next((s for s in seqs if len(s) > t0), seqs[0])
        out.append(p + [x for x in row[:t0] if x != sampling.eos_token_id])
    return out


def plan(num_drafters: int, num_prompts: int, max_new_tokens: int, alpha: float, power: float = 0.9, delta: float = 0.01) -> tuple[int, float, int]:
    """(number of chi-square tests m, per-test level alpha/m, rows per arm for ``delta``)."""
    m = max(num_drafters * num_prompts * (max_new_tokens + 1), 1)
    a = alpha / m
    return m, a, required_samples(a, power, delta)


def run_audit(
    target,
    drafters: dict[str, Drafter],
    prompts: list[list[int]],
    sampling: SamplingParams,
    k: int = 3,
    n: int | None = None,
    alpha: float = 1e-3,
    max_samples: int | None = None,
    joint_tokens: int = 2,
    seed: int = 0,
    batch: int = 4096,
    rejection_fn: Callable | None = None,
    skipped: dict[str, str] | None = None,
    greedy_prompts: list[list[int]] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> AuditResult:
    """Audit every drafter in ``drafters`` (name -> instance) against the target (a LeanLM).

    n: rows per arm and prompt (None: :func:`required_samples` for a 1 % shift, capped by
    ``max_samples``). rejection_fn: replaces the engine's rejection sampler for the speculative
    arms (to check that the audit catches a biased sampler).
    """
    t0 = time.perf_counter()
    say = on_progress or (lambda s: None)
    T = sampling.max_new_tokens
    j = min(joint_tokens, T)
    m, a, n_req = plan(len(drafters), len(prompts), T, alpha)
    if n is None:
        n = n_req if not max_samples else min(n_req, max_samples)
    res = AuditResult([], dict(skipped or {}), n, n_req, alpha, a, m, detectable_shift(n, a))
    greedy_sp = SamplingParams(0.0, 1.0, 0, max(T, 16), sampling.eos_token_id)
    patch = mock.patch.object(engine_mod, "rejection_sample", rejection_fn) if rejection_fn else None

    ar_engine = RolloutEngine(target, None, max_batch_size=batch)
    greedy_prompts = greedy_prompts or prompts
    ar_greedy = ar_engine.generate(greedy_prompts, greedy_sp).tokens
    for pi, prompt in enumerate(prompts):
        say(f"prompt {pi}: autoregressive, {n} rows")
        ar = ar_engine.generate([prompt] * n, sampling, torch.Generator(ar_engine.device).manual_seed(seed + 1000 * pi)).tokens
        for di, (name, drafter) in enumerate(drafters.items()):
            say(f"prompt {pi}: {name} k={k}, {n} rows")
            eng = RolloutEngine(target, drafter, k=k, max_batch_size=batch)
            gen = torch.Generator(eng.device).manual_seed(seed + 1000 * pi + di + 1)
            if patch:
                with patch:
                    out = eng.generate([prompt] * n, sampling, gen)
            else:
                out = eng.generate([prompt] * n, sampling, gen)
            c = out.counters
            acc = res.acceptance.setdefault(name, 0.0)
            res.acceptance[name] = acc + (c.num_accepted_tokens / max(c.num_draft_tokens, 1)) / len(prompts)
            for t in range(T):
                stat, df, p = two_sample_chi2(position_counts(out.tokens, t), position_counts(ar, t))
                res.tests.append(AuditTest(name, f"pos {t}", pi, p, p > a, f"chi2={stat:.1f} df={df}"))
            stat, df, p = two_sample_chi2(joint_counts(out.tokens, j), joint_counts(ar, j))
            res.tests.append(AuditTest(name, f"joint 0..{j - 1}", pi, p, p > a, f"chi2={stat:.1f} df={df}"))
    for name, drafter in drafters.items():
        eng = RolloutEngine(target, drafter, k=k, max_batch_size=batch)
        if patch:
            with patch:
                sv = eng.generate(greedy_prompts, greedy_sp).tokens
        else:
            sv = eng.generate(greedy_prompts, greedy_sp).tokens
        bad = [i for i, (x, y) in enumerate(zip(sv, ar_greedy)) if x != y]
        res.tests.append(AuditTest(name, "greedy", -1, None, not bad, f"{len(sv) - len(bad)}/{len(sv)} prompts identical"))
    res.wall_s = time.perf_counter() - t0
    return res


def summary_rows(res: AuditResult) -> list[tuple[str, str, str, str, str]]:
    """One row per drafter x test (worst p-value over prompts): drafter, test, min p, result, detail."""
    groups: dict[tuple[str, str], list[AuditTest]] = {}
    for t in res.tests:
        groups.setdefault((t.drafter, t.test), []).append(t)
    rows = []
    for (d, name), ts in groups.items():
        ps = [t.pvalue for t in ts if t.pvalue is not None]
        ok = all(t.passed for t in ts)
        worst = min(ts, key=lambda t: t.pvalue if t.pvalue is not None else 1.0)
        rows.append((d, name, f"{min(ps):.2e}" if ps else "-", "pass" if ok else "FAIL", worst.detail))
    return rows
