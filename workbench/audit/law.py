"""The statistical exactness audit (see the package docstring): speculative samples vs the target's exact law."""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, NamedTuple
from unittest import mock

import torch
from scipy import stats

from workbench.audit.engines import EngineOptions, build_engine
from workbench.audit.joint import Joint2, exact_joint2
from workbench.rollout import engine as engine_mod
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.drafter import Drafter
from workbench.rollout.sampling import SamplingParams, is_stop, probs_from_logits, sample
from workbench.rollout_builder import EngineConfig, plain_backend

END = -1  # category: the row finished (at eos or another stop id) before this position


def required_samples(alpha_test: float, power: float = 0.9, delta: float = 0.01, p: float = 0.5) -> int:
    """Rows for a two-sided one-sample test at level ``alpha_test`` (against the exact law) to detect
    a shift of ``delta`` in a probability near ``p`` with the given power (normal approximation)."""
    z = stats.norm.isf(alpha_test / 2) + stats.norm.isf(1 - power)
    return int(math.ceil(z * z * p * (1 - p) / delta**2))


def detectable_shift(n: int, alpha_test: float, power: float = 0.9, p: float = 0.5) -> float:
    """Smallest absolute probability shift detectable with ``n`` rows (inverse of :func:`required_samples`)."""
    z = stats.norm.isf(alpha_test / 2) + stats.norm.isf(1 - power)
    return z * math.sqrt(p * (1 - p) / max(n, 1))


LOW_POWER_SHIFT = 0.1  # a test that cannot detect a 10-point shift (power 0.9) is reported as low power


class Fit(NamedTuple):
    """A goodness-of-fit test's result and which test it was: ``chi2`` (Pearson, pooled cells),
    ``binomial`` (one cell held the mass: the count outside it, exact), ``impossible`` (a row on a token
    of probability 0) or ``none`` (one cell, nothing to compare: no cell expects 5 rows, or every row is
    where the law puts all its mass)."""

    statistic: float
    df: int
    pvalue: float
    test: str


def goodness_of_fit(
    observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0
) -> tuple[float, int, float]:
    """(statistic, df, p-value) of :func:`fit_test`."""
    return fit_test(observed, expected, min_expected)[:3]


def fit_detail(fit: Fit, rows: int, alpha_test: float) -> tuple[str, bool]:
    """(What a test's table row says: the test used and its numbers, with a warning when ``rows`` are too few
    for power; whether they are: :func:`detectable_shift` above ``LOW_POWER_SHIFT``)."""
    what = {
        "chi2": f"chi2={fit.statistic:.1f} df={fit.df}",
        "binomial": f"exact binomial (one cell holds the mass): {fit.statistic:.0f} of {rows} rows outside it",
        "impossible": "a row on a token of probability 0",
        "none": "no test possible (one cell: too few rows, or all where the law puts its mass)",
    }[fit.test]
    shift = detectable_shift(rows, alpha_test)
    low = fit.test != "impossible" and shift > LOW_POWER_SHIFT
    power = f"; low power: detects only shifts >= {100 * min(shift, 1):.0f} %" if low else ""
    return f"{what} rows={rows}{power}", low


def fit_test(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0) -> Fit:
    """Pearson chi-square of observed counts (C,) against expected counts (C,) with the same total:
    (statistic, df, p-value, "chi2"). Small-expectation cells are pooled (see module doc); an observation
    in a cell of expectation 0 gives p = 0 ("impossible"). One cell left: an exact binomial test of the
    count outside it (statistic = that count, df 1, "binomial"); no cell expecting ``min_expected`` rows, or
    nothing outside the one cell either -> (0, 0, 1.0, "none")."""
    o, e = observed.double(), expected.double()
    if bool((o[e <= 0] > 0).any()):
        return Fit(float("inf"), 0, 0.0, "impossible")
    big = e >= min_expected
    oo, ee = o[big], e[big]
    rest_o, rest_e = o[~big].sum(), e[~big].sum()
    if rest_e >= min_expected or (oo.numel() == 0 and rest_e > 0):
        oo, ee = torch.cat([oo, rest_o[None]]), torch.cat([ee, rest_e[None]])
    elif rest_e > 0 or rest_o > 0:
        i = int(ee.argmin())
        oo[i] += rest_o
        ee[i] += rest_e
    if oo.numel() < 2:
        # one cell holds (nearly) all the mass: Pearson has nothing to compare, so test the count that
        # fell outside it against the mass the exact law puts there (exact binomial). Without this, a
        # sampler that put 87 % of rows on a token of probability 1e-6 passed (vLLM-CPU).
        total, big_e = float(o.sum()), float(e[big].sum()) if bool(big.any()) else 0.0
        out_o, out_p = int(round(total - float(o[big].sum()))), max(0.0, 1.0 - big_e / max(float(e.sum()), 1e-300))
        if total <= 0 or not bool(big.any()) or out_o == 0 and out_p == 0.0:  # nothing to compare
            return Fit(0.0, 0, 1.0, "none")
        p = float(stats.binomtest(out_o, int(round(total)), min(out_p, 1.0)).pvalue)
        return Fit(float(out_o), 1, p, "binomial")
    ee = ee * (oo.sum() / ee.sum())  # the same total (float error only; scipy checks it)
    res = stats.chisquare(oo.numpy(), ee.numpy())  # Pearson's statistic and its chi2(C-1) p-value
    return Fit(float(res.statistic), oo.numel() - 1, float(res.pvalue), "chi2")


@torch.no_grad()
def rows_per_forward(vocab_size: int, tokens_per_row: int, limit: int, budget: int = 1 << 27) -> int:
    """Rows per forward so that its (rows, tokens, V) logits stay within ``budget`` elements (512 MB
    of float32; the probabilities in float64 double it): 4096 rows of 4 tokens are 1.6 M logits for the
    embedded models' vocabulary, 805 M (3.2 GB) for SmolLM2's 49,152. At most ``limit``, at least 1."""
    return max(1, min(limit, budget // max(vocab_size * max(tokens_per_row, 1), 1)))


def expected_counts(
    target, prompt: list[int], toks: torch.Tensor, lens: torch.Tensor, sp: SamplingParams, chunk: int = 4096
) -> torch.Tensor:
    """E_t(v) = sum over rows alive at t of p(v | prompt + the row's tokens < t): (T, V) float64.

    toks (n, T) long sampled completions (anything past a row's length is ignored), lens (n,).
    Rows with the same tokens and length contribute the same conditionals, so only the distinct
    ones are teacher-forced (weighted by their counts): at the audit's short horizons a few
    thousand distinct rows stand for 10^5 samples. One prefill of the prompt; each chunk of
    distinct rows copies its cache and runs its T-1 tokens.
    """
    n, T = toks.shape
    P = len(prompt)
    dev = target.lm_head.weight.device
    V = target.cfg.vocab_size
    base = target.new_cache(1, P + T + 1)
    logits0, _ = target(
        torch.tensor([prompt], device=dev),
        torch.zeros(1, dtype=torch.long, device=dev),
        base,
        logits_col=torch.tensor([P - 1], device=dev),
    )
    E = torch.zeros(T, V, dtype=torch.float64, device=dev)
    E[0] = probs_from_logits(logits0[0, 0], sp).double() * n
    if T == 1:
        return E
    lens = lens.clamp_max(T)
    chunk = rows_per_forward(V, T - 1, chunk)
    # (n, T)
    key = torch.cat([torch.where(torch.arange(T - 1)[None, :] < lens[:, None], toks[:, : T - 1], -1), lens[:, None]], 1)
    uniq, counts = torch.unique(key, dim=0, return_counts=True)  # (U, T), (U,)
    for i in range(0, uniq.shape[0], chunk):
        u = uniq[i : i + chunk]
        c = u.shape[0]
        cache = target.new_cache(1, P + T + 1, capacity=c)
        for dst, src in zip(cache.k + cache.v, base.k + base.v):
            dst.copy_(src)  # the prompt's entries
        cache.select(torch.zeros(c, dtype=torch.long, device=dev))  # (1, ...) -> (c, ...) in place
        inp = u[:, : T - 1].clamp_min(0).to(dev)  # (c, T-1)
        logits, _ = target(inp, torch.full((c,), P, device=dev), cache)  # (c, T-1, V): p of tokens 1..T-1
        p = probs_from_logits(logits, sp).double()
        alive = (torch.arange(1, T, device=dev)[None, :] < u[:, -1].to(dev)[:, None]).double()  # (c, T-1)
        w = alive * counts[i : i + chunk].to(dev).double()[:, None]  # (c, T-1) rows standing behind each
        E[1:] += (p * w[..., None]).sum(0)
    return E


def position_counts(seqs: list[list[int]], t: int) -> Counter:
    return Counter(s[t] if t < len(s) else END for s in seqs)


def deviation(observed: torch.Tensor, expected: torch.Tensor, top: int = 2) -> str:
    """Evidence of a test: total variation between the observed and the exact law, and the cells
    that deviate most (standardised residual), as ``TV=0.93; tok 16: 42.1 % (exact 0.05 %)``."""
    o, e = observed.double(), expected.double()
    n = float(o.sum())
    if n <= 0:
        return "TV=-"
    po, pe = o / n, e / max(float(e.sum()), 1e-300)
    tv = 0.5 * float((po - pe).abs().sum())
    z = (o - e) / e.clamp_min(0.5).sqrt()
    cells = [int(i) for i in z.abs().topk(min(top, z.numel())).indices]
    return f"TV={tv:.3f}; " + ", ".join(
        f"cell {i}: {100 * float(po[i]):.2f} % (exact {100 * float(pe[i]):.2f} %)" for i in cells
    )


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
    low_power: bool = False  # too few rows to detect a LOW_POWER_SHIFT (fit_detail): a pass says little


@dataclass
class AuditResult:
    tests: list[AuditTest]
    skipped: dict[str, str]
    n: int  # rows per drafter and prompt
    n_required: int  # rows for a 1 % shift at p = 0.5
    alpha: float
    alpha_test: float
    num_tests: int
    shift: float  # detectable shift at n (1-df, p = 0.5, power 0.9)
    acceptance: dict[str, float] = field(default_factory=dict)
    # per drafter, [accepted at draft position 0, verifications with a draft] over its sampled rows
    first_acceptance: dict[str, list[int]] = field(default_factory=dict)
    wall_s: float = 0.0
    # per drafter, the sampled generations' steps as (rows in the forward, k_t): whether the audited
    # engine chose k per step and retired rows (to capture sizes) is read off these
    steps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    engine: EngineOptions = field(default_factory=EngineOptions)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tests)


def plan(
    num_drafters: int, num_prompts: int, max_new_tokens: int, alpha: float, power: float = 0.9, delta: float = 0.01
) -> tuple[int, float, int]:
    """(number of chi-square tests m, per-test level alpha/m, rows per arm for ``delta``)."""
    m = max(num_drafters * num_prompts * (max_new_tokens + 1), 1)
    a = alpha / m
    return m, a, required_samples(a, power, delta)


def run_audit(
    target,
    drafters: dict[str, Drafter | object],
    prompts: list[list[int]] | Mapping[str, list[list[int]]],
    sampling: SamplingParams,
    k: int = 3,
    n: int | None = None,
    alpha: float = 1e-3,
    max_samples: int | None = None,
    seed: int = 0,
    batch: int = 4096,
    rejection_fn: Callable | None = None,
    skipped: dict[str, str] | None = None,
    greedy_prompts: list[list[int]] | None = None,
    on_progress: Callable[[str], None] | None = None,
    engine: EngineOptions | None = None,
) -> AuditResult:
    """Audit every drafter in ``drafters`` (name -> instance) against the target (a LeanLM).

    A value that is a rollout backend (:class:`workbench.rollout.backend.RolloutBackend`, e.g. a
    vLLM engine: ``workbench.vllm.measure.audit``) is audited as it generates; a drafter is run in the
    workbench engine at ``k`` (:func:`workbench.audit.engines.build_engine`). ``prompts``: the contexts
    every drafter is audited at, or per drafter name its own (as many for each: ``--context accepted``).

    n: rows per drafter and prompt (None: :func:`required_samples` for a 1 % shift, capped by
    ``max_samples``). rejection_fn: replaces the engine's rejection sampler (to check that the
    audit catches a biased sampler). engine: adaptive k, retire buckets, compile for the workbench
    engine (:class:`workbench.audit.engines.EngineOptions`; default: none of them).

    Raises:
        ValueError: a mapping of contexts whose names are not the drafters' or whose lists differ in length.
    """
    t0 = time.perf_counter()
    say = on_progress or (lambda s: None)
    T = sampling.max_new_tokens
    per = prompts if isinstance(prompts, Mapping) else {name: prompts for name in drafters}
    if set(per) != set(drafters) or len({len(v) for v in per.values()}) > 1:
        raise ValueError("run_audit: per-drafter contexts need one list per drafter name, all of one length")
    num_prompts = max((len(v) for v in per.values()), default=0)
    m, a, n_req = plan(len(drafters), num_prompts, T, alpha)
    if n is None:
        n = n_req if not max_samples else min(n_req, max_samples)
    opts = engine or EngineOptions()
    res = AuditResult([], dict(skipped or {}), n, n_req, alpha, a, m, detectable_shift(n, a), engine=opts)
    greedy_sp = greedy_params(sampling, max(T, 16))
    patch = (
        mock.patch.object(engine_mod, "rejection_sample", rejection_fn) if rejection_fn else contextlib.nullcontext()
    )
    V = target.cfg.vocab_size
    batch = rows_per_forward(V, k + 1, batch)  # a real vocabulary: fewer rows per verification forward
    for pi in range(num_prompts):
        joints: dict[tuple[int, ...], Joint2] = {}  # drafters audited at one context share its exact joint law
        for di, (name, drafter) in enumerate(drafters.items()):
            prompt = per[name][pi]
            if T >= 2 and tuple(prompt) not in joints:
                joints[tuple(prompt)] = exact_joint2(target, prompt, sampling, sampling.stop_ids, n=n)
            joint = joints.get(tuple(prompt))
            say(f"prompt {pi}: {name} k={k}, {n} rows")
            eng = _engine(target, drafter, k, batch, n, opts)
            gen = torch.Generator(target.lm_head.weight.device).manual_seed(seed + 1000 * pi + di + 1)
            with patch:
                out = eng.generate([prompt] * n, sampling, gen)
            c = out.counters
            res.steps.setdefault(name, []).extend(zip(c.rows_per_forward, c.k_per_step))
            acc = res.acceptance.setdefault(name, 0.0)
            res.acceptance[name] = acc + (c.num_accepted_tokens / max(c.num_draft_tokens, 1)) / num_prompts
            first = res.first_acceptance.setdefault(name, [0, 0])  # draft position 0: accepted, verifications
            first[0] += c.num_accepted_tokens_per_pos[0] if c.num_accepted_tokens_per_pos else 0
            first[1] += c.num_drafts
            lens = torch.tensor([len(x) for x in out.tokens])
            # (n, T), -1 past a row's end
            toks = torch.tensor([x + [-1] * (T - len(x)) for x in out.tokens], dtype=torch.long)
            say(f"prompt {pi}: {name}: exact conditionals of the sampled rows")
            E = expected_counts(target, prompt, toks, lens, sampling).cpu()
            for t in range(T):
                alive = lens > t
                observed = torch.bincount(toks[alive, t], minlength=V).double()
                fit = fit_test(observed, E[t])
                what, low = fit_detail(fit, int(alive.sum()), a)
                detail = f"{what} {deviation(observed, E[t].double())}"
                res.tests.append(AuditTest(name, f"pos {t}", pi, fit.pvalue, fit.pvalue > a, detail, low))
            if joint is not None:
                two = continued_past_first(toks, lens, sampling)
                observed = joint.observed(toks[two, 0], toks[two, 1])
                Ej = joint.probs() * float(two.sum())
                fit = fit_test(observed, Ej)
                what, low = fit_detail(fit, int(two.sum()), a)
                detail = f"{what} {deviation(observed, Ej)}"
                res.tests.append(AuditTest(name, "joint 0..1", pi, fit.pvalue, fit.pvalue > a, detail, low))
    greedy = greedy_prompts or next(iter(per.values()), [])
    ar_greedy = plain_backend(target, EngineConfig(max_batch_size=batch)).generate(greedy, greedy_sp).tokens
    for name, drafter in drafters.items():
        eng = _engine(target, drafter, k, batch, len(greedy), opts)
        with patch:
            sv = eng.generate(greedy, greedy_sp).tokens
        bad = [i for i, (x, y) in enumerate(zip(sv, ar_greedy)) if x != y]
        res.tests.append(
            AuditTest(name, "greedy", -1, None, not bad, f"{len(sv) - len(bad)}/{len(sv)} prompts identical")
        )
    res.wall_s = time.perf_counter() - t0
    return res


def greedy_params(sampling: SamplingParams, max_new_tokens: int) -> SamplingParams:
    """``sampling`` at temperature 0 (no top-k/top-p) and ``max_new_tokens`` tokens, with the same
    stop ids: the greedy identity check must end rows where the audited engines do."""
    return replace(sampling, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)


def continued_past_first(toks: torch.Tensor, lens: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """(n,) bool: the rows the joint test counts, those with a second token.

    toks (n, T) long completions (-1 past a row's end), lens (n,) their lengths in tokens. Every stop
    id ends a row as eos does, so a row whose x0 is one has no x1; testing x0 as well as the length
    conditions the rows on the same event as the exact law (:func:`exact_joint2` drops every stop
    id at x0), whatever an engine did past a stop.
    """
    return (lens >= 2) & ~is_stop(toks[:, 0], sampling)


def _engine(target, drafter, k: int, batch: int, rows: int, opts: EngineOptions) -> RolloutBackend:
    """What generates an audited arm: the value itself if it is a rollout backend, else the
    workbench engine with it (``rows``: the generation's rows, for the adaptive policy's costs)."""
    return drafter if isinstance(drafter, RolloutBackend) else build_engine(target, drafter, k, batch, rows, opts)


def summary_rows(res: AuditResult) -> list[tuple[str, str, str, str, str]]:
    """One row per drafter x test (worst p-value over prompts): drafter, test, min p, result (pass, "pass
    (low power)" when a prompt's rows were too few to detect a ``LOW_POWER_SHIFT``, FAIL), detail."""
    groups: dict[tuple[str, str], list[AuditTest]] = {}
    for t in res.tests:
        groups.setdefault((t.drafter, t.test), []).append(t)
    rows = []
    for (d, name), ts in groups.items():
        ps = [t.pvalue for t in ts if t.pvalue is not None]
        ok = all(t.passed for t in ts)
        worst = min(ts, key=lambda t: t.pvalue if t.pvalue is not None else 1.0)
        result = ("pass (low power)" if any(t.low_power for t in ts) else "pass") if ok else "FAIL"
        rows.append((d, name, f"{min(ps):.2e}" if ps else "-", result, worst.detail))
    return rows
