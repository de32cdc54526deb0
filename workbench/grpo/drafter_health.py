"""The drafter-health alarm: acceptance that collapses after a weight sync, caught the step it happens.

Each GRPO step loads the policy's weights into the rollout backend (and an adapted drafter into its
drafter) before generating, so a step's ``spec/acceptance_rate`` (accepted / drafted tokens) is the
acceptance right after that weight sync. A sync that breaks the drafter (weights loaded into the wrong
tensors, a stale or mismatched head, a dtype or layout slip) shows there as acceptance falling to about
zero, while speculation stays exact and only slower; nothing fails by itself (the silent failure NeMo
RL and verl users reported).

The rule (:func:`collapse_reason`), on the run's own earlier healthy steps h_1..h_n:

- zero: acceptance < max(ZERO, FRACTION * median(h)) (0.02, or a tenth of the run's median) while
  median(h) > WAS_HEALTHY (0.1); from the second step on. Relative as well as absolute because a
  broken drafter's "zero" is chance agreement: on the micro preset a draft model with random
  embeddings is still accepted 2-3 % of the time (arith_chain's few likely tokens), down from 89 %;
- band: with n >= MIN_STEPS (3), acceptance < median(h) - max(BAND_MADS * 1.4826 * MAD(h), MIN_BAND):
  BAND_MADS = 4 robust standard deviations of the step-to-step spread (MAD scaled to sigma under
  normal noise), and at least MIN_BAND = 0.05 and REL_BAND = a quarter of the median below it, so a run
  whose acceptance barely moves (MAD ~ 0) does not alarm on a dip, nor a policy that drifts away from its
  drafter as GRPO trains: on the quickstart preset draft_model k = 5's acceptance went 0.60, 0.60, 0.60,
  0.51 over its first four steps (its three-step MAD 0.001) with nothing broken.

Only drops alarm. A collapsed step stays out of the band's history (so a collapse that persists keeps
alarming rather than becoming the new normal); a step without drafts (adaptive k chose plain steps
throughout, drafter.kind none) is not judged. Both backends count acceptance the same way (vLLM's
spec-decode counters feed the same SpecCounters), so the alarm reads the same metric on either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median

from workbench import metrics as M

ZERO = 0.02  # acceptance below this is "about zero"
FRACTION = 0.1  # ... and so is acceptance below this fraction of the earlier steps' median
WAS_HEALTHY = 0.1  # ... an alarm when the earlier steps' median was above this
MIN_STEPS = 3  # earlier healthy steps before the band applies
BAND_MADS = 4.0  # the band's half-width in robust standard deviations (1.4826 MAD)
MIN_BAND = 0.05  # the band's least half-width (acceptance points)
REL_BAND = 0.25  # ... and at least this fraction of the median (a policy drifting from its drafter)
MAD_TO_SIGMA = 1.4826  # MAD of normal noise x this = its standard deviation

DRAFTER_HEALTH = M.DRAFTER_HEALTH


class DrafterCollapse(RuntimeError):
    """``drafter.on_collapse: fail``: the drafter's acceptance collapsed; the message is one line."""


def collapse_reason(history: Sequence[float], rate: float) -> str | None:
    """Why acceptance ``rate`` is a collapse against the earlier healthy steps' ``history``, or None (pure).

    Returns a one-line reason naming the rule and its numbers (module doc)."""
    if not history:
        return None
    med = median(history)
    if rate < max(ZERO, FRACTION * med) and med > WAS_HEALTHY:
        return (
            f"acceptance {rate:.3f} is about zero (< max({ZERO}, {FRACTION:g} x the earlier steps' median {med:.3f}))"
        )
    if len(history) >= MIN_STEPS:
        mad = median(abs(h - med) for h in history)
        low = med - max(BAND_MADS * MAD_TO_SIGMA * mad, MIN_BAND, REL_BAND * med)
        if rate < low:
            return (
                f"acceptance {rate:.3f} fell below the run's band {low:.3f} (median {med:.3f} of {len(history)} "
                f"earlier steps - max({BAND_MADS:g} x 1.4826 MAD {mad:.3f}, {MIN_BAND}, {REL_BAND:g} x median))"
            )
    return None


class DrafterHealth:
    """The alarm over a run's steps: :meth:`check` each step's metrics after the step's weight sync.

    on_collapse: ``warn`` (log ``spec/drafter_health`` 0 and warn once) or ``fail`` (also raise
    :class:`DrafterCollapse` from :meth:`raise_if_failed`, after the step's metrics are logged);
    warn: called once with the first collapse's message."""

    def __init__(self, on_collapse: str = "warn", warn: Callable[[str], None] | None = None):
        if on_collapse not in ("warn", "fail"):
            raise ValueError(f"drafter.on_collapse: {on_collapse!r} is not one of 'warn', 'fail'")
        self.on_collapse, self.warn = on_collapse, warn or (lambda msg: None)
        self.history: list[float] = []  # acceptance of the healthy steps so far
        self.failure: str | None = None  # the collapse that ends the run (on_collapse fail)
        self._warned = False

    def check(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """``{spec/drafter_health: 1 or 0}`` for a step that drafted (``spec/acceptance_rate`` present), else {}."""
        rate = metrics.get(M.ACCEPTANCE_RATE)
        if rate is None or not metrics.get(M.NUM_DRAFT_TOKENS, 1.0):
            return {}
        why = collapse_reason(self.history, rate)
        if why is None:
            self.history.append(float(rate))
            return {DRAFTER_HEALTH: 1.0}
        msg = f"drafter collapsed at step {step}: {why}"
        if not self._warned:
            self._warned = True
            self.warn(msg + ("" if self.on_collapse == "fail" else " (drafter.on_collapse=fail ends the run)"))
        if self.on_collapse == "fail" and self.failure is None:
            self.failure = msg + " (drafter.on_collapse=fail)"
        return {DRAFTER_HEALTH: 0.0}

    def raise_if_failed(self) -> None:
        """Raise :class:`DrafterCollapse` once a collapse was seen under ``on_collapse: fail``."""
        if self.failure is not None:
            raise DrafterCollapse(self.failure)
