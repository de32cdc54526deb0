"""Adaptive speculation (drafter.adaptive): the choice of k_t (pure maths), exactness when k_t
varies step by step for every drafter kind (greedy token for token, and sampled rollouts against
the target's exact law), and `wb run` end to end."""

import pytest
import torch

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from drafters.suffix import SuffixDrafter
from workbench.rollout.cost import best_k, expected_emitted
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.kpolicy import AdaptiveK
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama

FLAT = lambda T: 1.0  # noqa: E731  (memory-bound: a forward costs the same for any tokens in flight)
LINEAR = lambda T: 0.1 * T  # noqa: E731  (compute-bound: cost grows with tokens in flight)
FREE = lambda n, k: 0.0  # noqa: E731


def test_expected_emitted_is_leviathans_sum():
    a = 0.6
    surv = [a ** (i + 1) for i in range(4)]
    assert expected_emitted(surv, 4) == pytest.approx((1 - a**5) / (1 - a))  # 1 + a + ... + a^4
    assert expected_emitted(surv, 0) == 1.0
    assert expected_emitted(surv, 2, draft_share=0.5) == pytest.approx(1 + 0.5 * (0.6 + 0.36))


def test_best_k_speculates_fully_when_verification_is_free_and_drafts_hold():
    assert best_k(64, [0.99] * 5, 1.0, FLAT, FREE, 5) == 5


def test_best_k_decodes_plainly_when_drafts_fail_or_cost_too_much():
    assert best_k(8, [0.01] * 5, 1.0, LINEAR, FREE, 5) == 0  # verification costs, nothing accepted
    assert best_k(8, [0.9] * 5, 1.0, FLAT, lambda n, k: 10.0 * k, 5) == 0  # drafting dearer than a forward


def test_best_k_grows_as_the_batch_shrinks_into_the_tail():
    """Compute-bound per token plus a fixed per-forward overhead: the long tail gets more drafts."""
    cost = lambda T: 1.0 + 0.05 * T  # noqa: E731
    surv = [0.7 ** (i + 1) for i in range(6)]
    ks = [best_k(n, surv, 1.0, cost, FREE, 6) for n in (256, 64, 8, 1)]
    assert ks == sorted(ks) and ks[0] < ks[-1]


def test_estimates_converge_to_the_streams_acceptance():
    p = AdaptiveK(4, FLAT, FREE, decay=0.95)
    alpha, rows = 0.8, 100
    for _ in range(200):  # rows accepted through position i: rows * alpha^(i+1)
        p.update(4, rows, rows, [round(rows * alpha ** (i + 1)) for i in range(4)])
    assert p.survival() == pytest.approx([alpha ** (i + 1) for i in range(4)], abs=0.02)
    assert p.draft_share() == pytest.approx(1.0, abs=0.01)


TAIL = lambda T: 1.0 + 0.1 * T  # noqa: E731  (a fixed cost per forward plus a cost per token in flight)


def _plays(p, n, steps):
    chosen = []
    for _ in range(steps):
        k = p.choose(n)
        chosen.append(k)
        p.update(k, n, n if k else 0, [0] * k)
    return chosen


def test_a_shut_off_drafter_is_probed_again_where_a_probe_is_cheap():
    p = AdaptiveK(3, TAIL, FREE, probe_every=4, p0=0.05, measured=False)
    for _ in range(30):
        p.update(3, 1, 1, [0, 0, 0])  # nothing ever accepted
    chosen = _plays(p, 1, 10)  # one row: a one-draft probe costs 9 % more than a plain step
    assert chosen.count(0) >= 6 and 1 in chosen  # mostly plain steps, one probe every 4
    assert _plays(p, 64, 200) == [0] * 200  # 64 rows: a probe would cost 87 % more, none is made


def test_probes_back_off_while_speculation_does_not_pay_and_plain_steps_keep_the_estimates():
    p = AdaptiveK(3, TAIL, FREE, probe_every=2, max_probe_every=8, p0=0.05, measured=False)
    for _ in range(30):
        p.update(3, 1, 1, [0, 0, 0])
    before = p.survival()
    chosen = _plays(p, 1, 40)
    probes = [i for i, k in enumerate(chosen) if k]
    # intervals 2, 4, 8 (capped) plain steps + the probe
    assert [b - a for a, b in zip(probes, probes[1:])][:3] == [
        5,
        9,
        9,
    ]
    assert max(p.survival()) < 0.02 and max(before) < 0.02  # the probes brought no acceptance
    now = p.survival()
    p.update(0, 1, 0, [])
    assert p.survival() == now  # a plain step says nothing about acceptance: no forgetting


def test_measured_step_times_correct_the_cost_curves():
    """Curves say one draft is nearly free (FLAT); the steps say a k_t = 1 step takes 3 plain steps'
    time: with measurements the policy stops speculating at that bin, without it keeps going."""
    kw = dict(prior=0.0, p0=0.5)
    for measured, expect in ((True, 0), (False, 1)):
        p = AdaptiveK(1, FLAT, FREE, measured=measured, **kw)
        p.update(1, 64, 64, [32])  # acceptance 0.5: E[N] = 1.5 at k_t = 1
        p.observe(0, 64, 1.0)
        p.observe(1, 64, 3.0)
        assert p.choose(64) == expect
    assert p.scale(64, 1) == 3.0 and p.scale(40, 1) == 3.0  # its bin's
    assert p.scale(64, 2) == 1.0 and p.scale(8, 1) == 3.0  # else the bin's plain step's, else the k_t's over all bins
    p.observe(1, 8, 1.0)  # the step chosen last (k_t = 1 after plain steps) was a switch: not measured
    assert p.scale(8, 1) == 3.0
    p.observe(1, 8, 1.0)
    assert p.scale(8, 1) == 1.0 and p.scale(64, 1) == 3.0 and p.ratio_k[1] == pytest.approx(0.8 * 3 + 0.2 * 1)


def test_each_batch_size_bin_starts_with_a_measured_plain_step():
    p = AdaptiveK(2, FLAT, FREE, p0=0.99)  # the prior alone would speculate fully
    assert p.choose(64) == 0  # bin 64 not measured yet
    p.observe(0, 64, 1.0)
    assert p.choose(64) == 2 and p.choose(3) == 0  # bin 64 anchored; bin 4 is new


def test_the_cached_choice_is_recomputed_after_speculative_steps_and_every_refresh_steps():
    p = AdaptiveK(1, FLAT, FREE, p0=0.99, refresh=4)
    p.observe(0, 64, 1.0)  # (1 step since the cache was made)
    assert p.choose(64) == 1
    p.observe(1, 64, 1.0)  # (2) a switch from plain steps: not measured
    assert p.choose(64) == 1
    p.observe(1, 64, 50.0)  # (3) k_t = 1 measured 50x dearer than modeled
    assert p.choose(64) == 1  # cached until `refresh` steps have passed
    p.observe(1, 64, 50.0)  # (4)
    assert p.choose(64) == 0  # recomputed
    q = AdaptiveK(2, FLAT, FREE, p0=0.99)
    q.observe(0, 64, 1.0)
    assert q.choose(64) == 2
    for _ in range(20):
        q.update(2, 64, 64, [0, 0])  # nothing accepted: the cached choice goes at once
    assert q.choose(64) == 0


def test_a_switch_is_made_only_where_the_next_steps_repay_its_measured_catch_up():
    """Curves: a step costs 1 s whatever k_t (FLAT), acceptance 0.5 (E[N] = 1.5 at k_t = 1): a
    speculative step saves 0.5 s. A switch measured 3 s over its step: 8 steps repay it (4 s), 4 do not."""
    for horizon, expect in ((8, 1), (4, 0)):
        p = AdaptiveK(1, FLAT, FREE, prior=0.0, p0=0.5, switch_horizon=horizon)
        p.update(1, 64, 64, [32])
        p.observe(0, 64, 1.0)  # plain step: ratio 1
        assert p.choose(64) == 1  # no switch measured yet: switch (and measure it)
        p.observe(1, 64, 4.0)  # the switch: 3 s over the expected 1 s
        assert p.switch_s == 3.0 and p.scale(64, 1) == 1.0  # kept apart from the per-step ratios
        assert p.choose(64) == 1  # no switch now: already speculating
        p.update(1, 64, 64, [32])
        p.observe(1, 64, 1.0)
        p.update(0, 64, 0, [])
        p._prev = (0, 64)  # a plain step came between
        assert p.choose(64) == expect


def test_steps_left_are_learned_from_earlier_batches_per_batch_size_bin():
    p = AdaptiveK(2, FLAT, FREE, switch_horizon=8)
    assert p.steps_left(64) == 8  # no batch seen whole yet
    batch = [64] * 10 + [8, 7, 5] + [1, 1]  # steps at bins 64, 8, 1
    for n in batch:
        p.choose(n)
    p.choose(64)  # a new batch: the last one's counts are folded in
    assert p.steps_at == {64: 10, 8: 3, 1: 2}
    assert p.steps_left(64) == 9 + 3 + 2  # one of bin 64's ten steps already taken
    assert p.steps_left(3) == 2 and p.steps_left(1) == 2  # bin 4 was skipped: only bin 1's steps
    for n in [64] * 5 + [1] * 4:
        p.choose(n)
    p.choose(64)
    assert p.steps_at[64] == pytest.approx(0.8 * 10 + 0.2 * 6) and p.steps_at[8] == pytest.approx(0.8 * 3)


def test_no_probe_where_a_switch_makes_it_dear():
    p = AdaptiveK(3, TAIL, FREE, probe_every=1, p0=0.05)
    for _ in range(30):
        p.update(3, 1, 1, [0, 0, 0])
    p.observe(0, 1, TAIL(1))  # bin 1 anchored, ratio 1
    assert 1 in _plays(p, 1, 4)  # a probe costs 0.1 s over a 1.1 s plain step
    p.switch_s = 1.0  # as if measured: a switch (so a probe) costs 1 s more
    p._memo = {}
    assert _plays(p, 1, 20) == [0] * 20


class Scripted:
    """Plays a fixed sequence of k_t (zeros included: plain decode steps, back to back)."""

    def __init__(self, script):
        self.script, self.i = script, 0

    def choose(self, num_rows):
        self.i += 1
        return self.script[(self.i - 1) % len(self.script)]

    def update(self, *a):
        pass


SCRIPT = [0, 0, 3, 1, 0, 2, 3, 0, 0, 0, 2]


def _drafter(kind, target_lm, draft_lm):
    if kind == "draft_model":
        return DraftModelDrafter(draft_lm)
    if kind == "ngram":
        return NgramDrafter(1, 3)
    if kind == "suffix":
        return SuffixDrafter(max_tree_depth=24, max_spec_factor=1.0, min_token_prob=0.0)
    from drafters import build_drafter
    from workbench.rollout.drafter import DrafterTarget
    from workbench.specs.drafter import DrafterSpec

    return build_drafter(kind, DrafterSpec(kind=kind), target=DrafterTarget(target_lm), device=torch.device("cpu"))


@pytest.mark.parametrize("kind", ["draft_model", "ngram", "suffix", "mtp", "eagle3", "dflash"])
def test_greedy_with_k_varying_per_step_equals_autoregressive(target_lm, draft_lm, kind):
    ar = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy())
    out = RolloutEngine(target_lm, _drafter(kind, target_lm, draft_lm), k=3, k_policy=Scripted(SCRIPT)).generate(
        PROMPTS * 2, greedy()
    )
    assert out.tokens == ar.tokens and out.finish_reasons == ar.finish_reasons
    for a, b in zip(ar.logprobs, out.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert out.counters.k_per_step[: len(SCRIPT)] == SCRIPT


def test_draft_model_catches_up_after_plain_steps_as_if_it_had_drafted(target_lm, draft_lm):
    """After k_t = 0 steps the draft model feeds the tokens it missed: its next proposal is what
    a drafter that proposed every step would propose (same cache content, greedy)."""
    self_draft = DraftModelDrafter(target_lm)  # drafting with the target itself: every draft accepted
    out = RolloutEngine(target_lm, self_draft, k=3, k_policy=Scripted([0, 0, 3])).generate(
        PROMPTS, greedy(eos=None, max_new=20)
    )
    m = out.counters.metrics()
    assert m["spec/acceptance_rate"] == 1.0  # a stale draft cache would propose other tokens


def test_draft_model_prefills_lazily_and_never_runs_when_every_step_is_plain(target_lm, draft_lm, monkeypatch):
    calls = []
    d = DraftModelDrafter(draft_lm)
    real = LeanLM.forward
    monkeypatch.setattr(
        LeanLM, "forward", lambda self, *a, **kw: (calls.append(self is d.model), real(self, *a, **kw))[1]
    )
    RolloutEngine(target_lm, d, k=3, k_policy=Scripted([0])).generate(PROMPTS, greedy(eos=None, max_new=8))
    assert calls and not any(calls)  # the target ran; the draft model never did


def test_draft_model_lazy_prefill_follows_rows_that_left_before_the_first_proposal(target_lm):
    """Rows that finish during plain steps leave before the draft model's prefill: the prefill must
    still give each remaining row its own prompt (self-drafting: every draft then is accepted)."""
    ar = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy(eos=None, max_new=12))
    eos = ar.tokens[0][2]  # row 0 (and its copy) stop at their third token, the others later or not
    ref = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy(eos=eos, max_new=12))
    assert len({len(t) for t in ref.tokens}) > 1  # rows do leave at different steps
    out = RolloutEngine(target_lm, DraftModelDrafter(target_lm), k=3, k_policy=Scripted([0, 0, 0, 0, 3])).generate(
        PROMPTS * 2, greedy(eos=eos, max_new=12)
    )
    assert out.tokens == ref.tokens
    assert out.counters.metrics()["spec/acceptance_rate"] == 1.0


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
@pytest.mark.parametrize("max_pending", [2, 1024])
def test_chain_entries_deferred_over_plain_steps_draft_as_if_written_each_step(
    target_lm, draft_lm, kind, max_pending, monkeypatch
):
    """The chain drafters write the prompts' entries at the first propose and plain steps' entries
    at the next propose (or every max_pending steps) in one forward: the proposals, so the
    acceptance counts, equal writing them each step, also when rows leave during plain steps."""
    import drafters.chain as chain

    ar = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy(eos=None, max_new=30))
    eos = ar.tokens[0][2]  # row 0 (and its copy) stop at their third token: before the first proposal

    def proposals(cap):
        monkeypatch.setattr(chain, "MAX_PENDING", cap)
        torch.manual_seed(0)  # the chain's (random) weights
        d = _drafter(kind, target_lm, draft_lm)
        seen, real = [], d.propose

        def record(ctx, k):
            prop = real(ctx, k)
            seen.append((prop.tokens, prop.probs))
            return prop

        d.propose = record
        out = RolloutEngine(target_lm, d, k=3, k_policy=Scripted([0, 0, 0, 3, 0, 2])).generate(
            PROMPTS * 2, greedy(eos=eos, max_new=30)
        )
        return seen, out

    each_step, out = proposals(1)  # flushed at once: the entries written in the plain step itself
    deferred, _ = proposals(max_pending)
    assert len({len(t) for t in out.tokens}) > 1  # rows left at different steps
    assert len(deferred) == len(each_step) > 3
    for (t1, q1), (t2, q2) in zip(each_step, deferred):
        assert torch.equal(t1, t2)
        torch.testing.assert_close(q1, q2, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_chain_never_runs_when_every_step_is_plain(target_lm, draft_lm, kind, monkeypatch):
    torch.manual_seed(0)
    d = _drafter(kind, target_lm, draft_lm)
    calls = []
    monkeypatch.setattr(d, "_feed_real", lambda *a, **kw: calls.append(1))
    RolloutEngine(target_lm, d, k=3, k_policy=Scripted([0])).generate(PROMPTS, greedy(eos=None, max_new=8))
    assert not calls


@pytest.mark.parametrize("kind,script", [("draft_model", [2, 0]), ("draft_model", [0, 1]), ("ngram", [0, 2])])
def test_sampled_rollouts_with_k_varying_per_step_follow_the_target(kind, script):
    target_hf = random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6)
    target = LeanLM.from_hf(target_hf)
    draft = LeanLM.from_hf(target_hf)
    draft.lm_head.weight.add_(0.3 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    drafter = DraftModelDrafter(draft) if kind == "draft_model" else NgramDrafter(1, 2)
    sp = SamplingParams(temperature=1.0, max_new_tokens=3)
    real = RolloutEngine.__init__

    def with_policy(self, *a, **kw):  # the conftest helper builds the engine; give it the scripted policy
        real(self, *a, **kw)
        self.k_policy = Scripted(script)

    RolloutEngine.__init__ = with_policy
    try:
        out = assert_rollouts_follow_target(target, drafter, [1, 3, 4, 3, 4], sp)
    finally:
        RolloutEngine.__init__ = real
    assert (
        set(out.counters.k_per_step) == set(script) or out.counters.k_per_step == script[: len(out.counters.k_per_step)]
    )


def test_wb_run_adaptive_logs_the_chosen_k(store):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(
        app, ["run", "micro", "drafter.adaptive=true", "drafter.k=4", "grpo.steps=2", "grpo.eval_every=0", "--quiet"]
    )
    assert res.exit_code == 0, res.output
    (run,) = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])
    m = run.data.metrics
    assert 0.0 <= m["spec/k_mean"] <= 4.0
    assert sum(m[f"spec/k_frac_{j}"] for j in range(5)) == pytest.approx(1.0)
    assert [x.step for x in store.get_metric_history(run.info.run_id, "spec/k_mean")] == [1, 2]
