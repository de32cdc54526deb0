"""Where the audit samples: contexts whose tested positions carry entropy and exercise speculation.

Two kinds (``wb audit --context``):

- ``uncertain`` (:func:`informative_prompts`, the default): the prompt plus the target's own sampled
  prefix, ending one token before the first position where the target is uncertain, so the first
  verified draft meets an uncertain token. Which drafts are accepted there is left to the drafter: on
  SmolLM2, ngram's acceptance at that context was 0.00, so its audit tested only the residual law
  after a rejection.
- ``accepted`` (:func:`accepting_contexts`): per drafter, the first cut of the target's own sampled
  completion where that drafter's first drafted position is accepted at a rate inside a band
  (default 0.3-0.9, measured in a short speculative probe), so the audit tests accepted drafts,
  rejected ones and the bonus token at one context. The band's lower edge makes accepted drafts a
  sizeable share of the rows; the upper keeps the target uncertain (acceptance of a deterministic draft x is
  p(x), Leviathan et al. 2023, so a rate near 1 means a near-certain token and a vacuous test).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from workbench.audit.engines import EngineOptions, build_engine
from workbench.audit.law import END, position_counts
from workbench.rollout.counters import SpecCounters
from workbench.rollout.sampling import SamplingParams
from workbench.rollout_builder import EngineConfig, plain_backend

ACCEPT_BAND = (0.3, 0.9)  # first-position acceptance of an ``accepted`` context
UNCERTAIN = 0.95  # a position is uncertain when its most frequent token is below this share of the rows


def first_uncertain(seqs: list[list[int]], scan: int, threshold: float) -> int | None:
    """First position whose most frequent token has frequency < ``threshold`` among ``seqs`` (None
    if none within ``scan``)."""
    for t in range(scan):
        c = position_counts(seqs, t)
        if c and c.most_common(1)[0][1] < threshold * len(seqs):
            return t
    return None


def informative_prompts(
    target,
    prompts: list[list[int]],
    sampling: SamplingParams,
    pilot: int = 256,
    scan: int = 64,
    threshold: float = 0.95,
    seed: int = 0,
    tries: int = 8,
) -> list[list[int]]:
    """Each prompt + the target's own sampled prefix, ending one token before an uncertain position
    (most frequent token < ``threshold`` in an autoregressive pilot of ``pilot`` rows).

    Why one before: the first completion token is sampled from the prefill's logits, never drafted
    (here and in vLLM), so an uncertain token there tests no speculation; placed at completion
    position 1 it is the first draft verified. Where the pilot is uncertain at once (position 0),
    the modal first token is appended and the pilot repeated (``tries`` times); the prompt is kept
    unchanged if no position within ``scan`` is uncertain. The pilot stops at every stop id of
    ``sampling`` (as the audited engines do), and no stop id is put into a context."""
    sp = replace(sampling, max_new_tokens=scan)  # keeps the stop ids: a pilot row ends where an audited one would
    eng = plain_backend(target, EngineConfig(max_batch_size=pilot))
    stops = set(sampling.stop_ids)
    out = []
    for i, p in enumerate(prompts):
        ctx = list(p)
        for attempt in range(tries):
            seqs = eng.generate(
                [ctx] * pilot,
                sp,
                torch.Generator(target.lm_head.weight.device).manual_seed(seed + 7 * i + 1009 * attempt),
            ).tokens
            t0 = first_uncertain(seqs, scan, threshold)
            if t0 is None:
                break
            if t0 >= 1:
                row = next((s for s in seqs if len(s) > t0), seqs[0])
                ctx += [x for x in row[: t0 - 1] if x not in stops]
                break
            modal = next(
                (tok for tok, _ in position_counts(seqs, 0).most_common() if tok not in stops and tok != END), None
            )
            if modal is None:
                break
            ctx.append(modal)
        out.append(ctx)
    return out


def first_position_acceptance(c: SpecCounters) -> float | None:
    """Accepted drafts at draft position 0 per verification that had a draft (vLLM's per-position
    acceptance rate, ``num_accepted_tokens_per_pos[0] / num_drafts``); None when nothing was drafted."""
    if not c.num_drafts or not c.num_accepted_tokens_per_pos:
        return None
    return c.num_accepted_tokens_per_pos[0] / c.num_drafts


def accepting_contexts(
    target,
    drafter,
    prompts: list[list[int]],
    sampling: SamplingParams,
    k: int,
    band: tuple[float, float] = ACCEPT_BAND,
    probe_rows: int = 64,
    scan: int = 64,
    seed: int = 0,
    engine: EngineOptions | None = None,
) -> list[tuple[list[int], float | None]]:
    """Per prompt, (context, its probed first-position acceptance): the prompt plus the first prefix of
    one sampled completion of the target (``scan`` tokens, stop ids left out) at which ``drafter`` at
    ``k``, decoding ``probe_rows`` rows of ``sampling`` for 2 tokens (the prefill's token, then one
    verification whose first draft is the one counted: completion position 1), has that draft accepted
    at a rate inside ``band``, drafts on at least half the rows, and the probe's rows are certain at
    position 0 and uncertain at 1 (modal token under ``UNCERTAIN`` of the rows: a model drafter can be
    rejected where the target is sure, which tests nothing of its law). Cuts are tried from the
    shortest; a prompt without such a cut is returned unchanged with acceptance None (the caller says
    so). Cost: at most ``scan`` probes of ``probe_rows`` rows x 2 tokens per prompt.

    Raises:
        ValueError: ``band`` is not 0 <= low < high <= 1.
    """
    lo, hi = band
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"accept band {band}: needs 0 <= low < high <= 1")
    dev = target.lm_head.weight.device
    stops = set(sampling.stop_ids)
    pilot = plain_backend(target, EngineConfig(max_batch_size=8))
    probe_sp = replace(sampling, max_new_tokens=2)  # the prefill's token and one verification: its first draft only
    out: list[tuple[list[int], float | None]] = []
    for i, p in enumerate(prompts):
        gen = torch.Generator(dev).manual_seed(seed + i)
        rows = pilot.generate([list(p)] * 8, replace(sampling, max_new_tokens=scan), gen)
        row = [x for x in max(rows.tokens, key=len) if x not in stops]  # the longest of 8: most cuts to try
        found: tuple[list[int], float | None] = (list(p), None)
        for t in range(len(row)):
            ctx = list(p) + row[:t]
            eng = build_engine(target, drafter, k, probe_rows, probe_rows, engine or EngineOptions())
            res = eng.generate([ctx] * probe_rows, probe_sp, torch.Generator(dev).manual_seed(seed + 31 * i + t))
            rate, c = first_position_acceptance(res.counters), res.counters
            # the target uncertain where the draft is verified, or a rejected draft's residual is one token
            uncertain = first_uncertain(res.tokens, 2, UNCERTAIN) == 1
            if rate is not None and lo <= rate <= hi and 2 * c.num_drafts >= probe_rows and uncertain:
                found = (ctx, rate)
                break
        out.append(found)
    return out
