"""Continuous batching (issue #24, item 3): with more prompts than ``max_batch_size``, waiting
prompts join the batch as rows finish. The slot schedule is the one the pure model counts, greedy
rollouts are unchanged for every drafter kind (adaptive k included), and sampled ones keep the law."""

import numpy as np
import pytest
import torch

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from drafters.suffix import SuffixDrafter
from workbench.perf.modeled import ar_rows_per_forward
from workbench.perf.steps import batch_steps, simulate_steps, simulate_steps_continuous, slot_schedule
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.kv_cache import KVCache
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, perturbed_draft, random_llama
from test_chain_drafters import _make, _rollout_rows, trained  # noqa: F401 (module fixture)
from test_evaluation import CountingK

# ---------------------------------------------------------------- the slot schedule, by hand


def test_slot_schedule_by_hand():
    # 2 slots; rows of 3, 1, 0 (finished at its prefill), 2, 2 forwards: row 0 in slot A at 0..3,
    # row 1 in slot B at 0..1, row 3 in slot B at 1..3, row 4 in slot A at 3..5 (B frees at 3 too)
    end, starts = slot_schedule([3, 1, 0, 2, 2], 2)
    assert end == 5 and list(starts[[0, 1, 3, 4]]) == [0, 0, 1, 3]


def test_ar_rows_per_forward_continuous_by_hand():
    # lengths include the prefill's token: decode forwards = L - 1 per row
    # forwards per row 3, 1, 0, 2, 2 (the schedule above): rows 0+1, 0+3, 0+3, 4, 4
    assert ar_rows_per_forward([4, 2, 1, 3, 3], 2, continuous=True) == [2, 2, 2, 1, 1]
    assert ar_rows_per_forward([4, 2, 1, 3, 3], 2) == [2, 1, 1, 1, 1, 1, 1]  # chunks (4, 2), (1, 3), (3)
    assert ar_rows_per_forward([4, 2], 8, continuous=True) == ar_rows_per_forward([4, 2], 8)


def test_continuous_steps_deterministic_and_sampled():
    # pmf [1]: one token per step, the schedule exactly; a sampled pmf: never more forwards than chunks
    assert simulate_steps_continuous([4, 2, 1, 3, 3], [1.0], 2) == (5.0, 8.0)
    pmf = np.array([0.5, 0.3, 0.2])
    lengths = [30, 5, 5, 30, 5, 5, 30, 5]
    S_c, R_c = batch_steps([lengths], 2, pmf, continuous=True)
    S_chunks = sum(simulate_steps(lengths[i : i + 2], pmf)[0] for i in range(0, 8, 2))
    assert S_c < S_chunks and R_c == pytest.approx(batch_steps([lengths], 2, pmf)[1], rel=0.05)


def test_kv_cache_append_in_place_and_grown():
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=4)
    a = KVCache(cfg, 2, 5, "cpu", torch.float32, capacity=3)
    b = KVCache(cfg, 1, 5, "cpu", torch.float32)
    a.k[0].fill_(1.0), b.k[0].fill_(2.0)
    ptr = a.base[0][0].data_ptr()
    a.append(b)
    assert a.k[0].shape[0] == 3 and a.base[0][0].data_ptr() == ptr  # in place: within capacity
    assert a.k[0][:, 0, 0, 0].tolist() == [1.0, 1.0, 2.0]
    a.append(b)  # past capacity: reallocated
    assert a.k[0].shape[0] == 4 and a.k[0][:, 0, 0, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


# ---------------------------------------------------------------- the engine


def test_engine_runs_the_slot_schedule():
    """Every forward's rows are what the continuous slot schedule of the completions gives, so
    waiting prompts really fill the freed slots (and chunks are what the chunked model gives)."""
    target = LeanLM.from_hf(random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6))
    prompts = [[1, 3, 4], [1, 5], [1], [1, 2, 6, 7], [1, 4, 4]] * 3  # 15 rollouts, 4 slots
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=2)  # 8 ids: EOS comes early and late
    for continuous in (True, False):
        out = RolloutEngine(target, max_batch_size=4, continuous=continuous).generate(
            prompts, sp, torch.Generator().manual_seed(3)
        )
        lengths = [len(t) for t in out.tokens]
        assert len(set(lengths)) > 3  # EOS spreads the lengths, or the test says nothing
        assert out.counters.rows_per_forward == ar_rows_per_forward(lengths, 4, continuous)


@pytest.fixture(scope="module")
def dflash_trained(target_lm):
    from test_dflash import train_dflash

    return train_dflash(target_lm)


def _drafter(kind, target_hf, trained, dflash=None):  # noqa: F811 (the argument: the value of the imported fixture)
    if kind == "dflash":
        return dflash
    if kind == "draft_model":
        return DraftModelDrafter(perturbed_draft(target_hf, 0.5))
    if kind == "ngram":
        return NgramDrafter(1, 3)
    if kind == "suffix":
        return SuffixDrafter()
    return trained[(kind, 1)]


@pytest.mark.parametrize("eos", [2, 19])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("kind", ["none", "ngram", "suffix", "draft_model", "mtp", "eagle3", "dflash"])
def test_greedy_continuous_equals_one_batch(
    target_hf,
    target_lm,
    trained,  # noqa: F811
    dflash_trained,
    kind,
    adaptive,
    eos,
):
    """Token for token what one batch of every prompt gives, with rows admitted into a running batch
    (the drafter's state extended: lazy prompt entries, held plain steps, caches); adaptive: k_t
    cycles 0..3 so rows join between plain steps and speculative ones. EOS 19 ends rows at the
    prefill and after one step: rows join before the first proposal."""
    if kind == "none" and adaptive:
        pytest.skip("no drafter, no k")
    # repeated prompts: prefix sharing within and across admissions; with EOS 19 the first batch's
    # rows end at their prefill, so rows join before anything else ran (the drafters' lazy state merged)
    prompts = [PROMPTS[3]] * 3 + PROMPTS * 2 + [[1, 9]]
    drafter = None if kind == "none" else _drafter(kind, target_hf, trained, dflash_trained)
    one = RolloutEngine(target_lm, drafter, k=3).generate(prompts, greedy(max_new=30, eos=eos))
    eng = RolloutEngine(target_lm, drafter, k=3, max_batch_size=3, k_policy=CountingK(3) if adaptive else None)
    out = eng.generate(prompts, greedy(max_new=30, eos=eos))
    assert out.tokens == one.tokens and out.finish_reasons == one.finish_reasons
    for a, b in zip(one.logprobs, out.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert max(out.counters.rows_per_forward) == 3 and len(out.counters.rows_per_forward) < sum(map(len, out.tokens))
    if drafter is not None and kind != "suffix":
        assert out.counters.num_accepted_tokens > 10
    if drafter is not None and kind != "suffix" and not adaptive:
        # a row's greedy drafts depend on its own tokens and the drafter's state of it alone (suffix
        # reads its siblings): a joined row whose state were wrong would accept differently
        assert out.counters.num_accepted_tokens_per_pos == one.counters.num_accepted_tokens_per_pos


@pytest.mark.parametrize("eos", [2, 19, None])
def test_self_drafting_accepts_as_one_batch_with_rows_joining(target_lm, eos):
    """The target as its own draft model: every greedy draft is accepted except those cut at a
    row's EOS or budget, the same ones as in one batch, unless a joined row's draft cache holds
    another prompt or misses tokens."""
    prompts = [PROMPTS[3]] * 3 + PROMPTS * 2 + [[1, 9]]
    one = (
        RolloutEngine(target_lm, DraftModelDrafter(target_lm), k=3)
        .generate(prompts, greedy(max_new=30, eos=eos))
        .counters
    )
    c = (
        RolloutEngine(target_lm, DraftModelDrafter(target_lm), k=3, max_batch_size=3)
        .generate(prompts, greedy(max_new=30, eos=eos))
        .counters
    )
    assert (
        c.num_accepted_tokens_per_pos == one.num_accepted_tokens_per_pos and c.num_draft_tokens == one.num_draft_tokens
    )
    assert c.num_accepted_tokens >= 0.8 * c.num_draft_tokens


def test_greedy_continuous_with_retire_buckets(target_lm, draft_lm):
    """Batch-size buckets (CUDA-graph capture sizes) with admissions: every forward runs at a
    bucket size, and the tokens are one batch's."""
    prompts = PROMPTS * 3
    one = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=2).generate(prompts, greedy(max_new=30))
    out = RolloutEngine(
        target_lm, DraftModelDrafter(draft_lm), k=2, max_batch_size=4, retire_buckets=(1, 2, 4)
    ).generate(prompts, greedy(max_new=30))
    assert out.tokens == one.tokens
    assert set(out.counters.rows_per_forward) <= {1, 2, 4}


@pytest.mark.parametrize("kind", ["draft_model", "eagle3"])
def test_sampled_continuous_rollouts_follow_target(kind):
    """The exact law with rows admitted as others finish (4096 slots for 30k rollouts), k_t
    cycling 0..2 so admissions meet held plain steps."""
    target_hf = random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6)
    target = LeanLM.from_hf(target_hf)
    if kind == "draft_model":
        d = DraftModelDrafter(perturbed_draft(target_hf, 0.3))
    else:
        rows, counts = _rollout_rows(target, n=64, max_new=8, layers=(0, 1, 2))
        d = _make(kind, target, counts, draft_vocab_size=5)
        from drafters.training import fit

        fit(d, rows, steps=30, lr=3e-3, batch_size=16)
    out = assert_rollouts_follow_target(
        target,
        d,
        [1, 3, 4, 3, 4],
        SamplingParams(temperature=1.0, max_new_tokens=3),
        max_batch_size=4096,
        k_policy=CountingK(2),
    )
    assert max(out.counters.rows_per_forward) == 4096 and len(set(out.counters.k_per_step)) == 3


def test_spec_field_and_vllm_refusal():
    from workbench.specs import load_spec
    from workbench.specs.resolve import admission_config
    from workbench.vllm import check_vllm_run

    assert load_spec("micro", []).rollout.continuous_batching is True
    spec = load_spec("micro", ["rollout.backend=vllm", "rollout.continuous_batching=false"])
    with pytest.raises(ValueError, match="rollout.continuous_batching"):
        check_vllm_run(admission_config(spec))


@pytest.mark.parametrize("kind", ["none", "eagle3"])
def test_a_group_admitted_row_by_row_is_prefilled_once(target_lm, trained, kind):  # noqa: F811
    """Continuous batching keeps prefix sharing: G rows of a prompt joining at different steps copy
    its prefill (KV, logits, the drafter's hidden states) instead of running the target again; the
    rollouts are one batch's."""
    prompts = [PROMPTS[0]] * 4 + [PROMPTS[4]] * 4 + [PROMPTS[1]] * 4
    drafter = trained[("eagle3", 1)] if kind == "eagle3" else None
    calls = []
    real = target_lm.forward

    def counting(*a, **kw):
        if kw.get("logits_col") is not None:
            calls.append(a[0].shape[0])  # distinct prompts computed by this prefill
        return real(*a, **kw)

    target_lm.forward = counting
    try:
        sp = SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=2)
        out = RolloutEngine(target_lm, drafter, k=2, max_batch_size=3).generate(
            prompts, sp, torch.Generator().manual_seed(0)
        )
        assert sum(calls) == 3  # one computed prefill per distinct prompt, however many admissions
        assert len(calls) > 1  # (rows did join later)
        calls.clear()
        one = RolloutEngine(target_lm, drafter, k=2).generate(prompts, greedy(max_new=24))
        cont = RolloutEngine(target_lm, drafter, k=2, max_batch_size=3).generate(prompts, greedy(max_new=24))
        assert cont.tokens == one.tokens
        if drafter is not None:
            assert cont.counters.num_accepted_tokens_per_pos == one.counters.num_accepted_tokens_per_pos
    finally:
        del target_lm.forward
    assert len(out.tokens) == 12
