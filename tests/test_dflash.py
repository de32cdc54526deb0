"""dflash, the one-pass block drafter: one draft forward per verification step, exact (greedy token for
token, the sampled joint law), its context cache equal to a fresh start after many steps, its loss, its
checkpoint and its refusals."""

import pytest
import torch

from drafters import DrafterTarget, build_drafter
from drafters.dflash import DFlashDrafter, dflash_loss
from drafters.training import collate, fit
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.specs import DrafterSpec

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama
from test_chain_drafters import _AgainstFresh, _rollout_rows

LAYERS = (0, 1, 2)  # the layers a dflash head over a 2-layer target reads


def _make(lm, counts=None, **fields) -> DFlashDrafter:
    spec = DrafterSpec(kind="dflash", **fields)
    return build_drafter("dflash", spec, DrafterTarget(lm, token_counts=counts), torch.device("cpu"))


def _rows(lm, n=96, max_new=30, seed=0):
    """The target's own sampled completions of random 3-token prompts, with the layers dflash reads."""
    return _rollout_rows(lm, n, max_new, seed, LAYERS)


def train_dflash(lm) -> DFlashDrafter:
    """A briefly trained dflash head (draft vocabulary 24 of 48, k 3): its drafts get accepted."""
    rows, counts = _rows(lm)
    torch.manual_seed(0)  # the head's random init too: the same head whichever tests ran before
    d = _make(lm, counts, draft_vocab_size=24, k=3)
    fit(d, rows, steps=80, lr=3e-3, batch_size=16)
    return d


@pytest.fixture(scope="module")
def trained(target_lm):
    return train_dflash(target_lm)


def test_loss_decreases_on_a_fixed_batch(target_lm):
    rows, counts = _rows(target_lm, n=32)
    d = _make(target_lm, counts, draft_vocab_size=24)
    batch = collate(rows)
    params = d.train_parameters()
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=3e-3)
    torch.manual_seed(0)
    first = None
    for _ in range(40):
        loss, stats = dflash_loss(d.net, batch, d.block_size, 0.8, restrict=(d.net.d2t, d.net.t2d))
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < 0.8 * first
    assert {"draft/loss", "draft/loss_pos_1", "draft/top1_agreement"} <= set(stats)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_speculative_equals_greedy_autoregressive(target_lm, trained, k):
    ar = RolloutEngine(target_lm).generate(PROMPTS, greedy())
    sv = RolloutEngine(target_lm, trained, k=k).generate(PROMPTS, greedy())
    assert sv.tokens == ar.tokens and sv.finish_reasons == ar.finish_reasons
    assert sv.counters.num_accepted_tokens > 0  # trained drafts do get accepted


def test_one_draft_forward_per_verification_step(target_lm, trained):
    """k drafts cost one forward of the head, whatever k (the chain drafters run k)."""
    for k in (2, 5):
        before = trained.forwards
        out = RolloutEngine(target_lm, trained, k=k).generate(PROMPTS[:2], greedy(max_new=20))
        assert trained.forwards - before == out.counters.num_verify_steps


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=1.0, max_new_tokens=3),
        SamplingParams(temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=3),
    ],
    ids=["T1", "T0.7-topk-topp"],
)
def test_sampled_speculative_rollouts_follow_target(sp):
    """5 of 8 ids in the draft vocabulary: q is zero outside it, and k = 3 < block - 1."""
    target = LeanLM.from_hf(random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6))
    rows, counts = _rows(target, n=64, max_new=8)
    d = _make(target, counts, draft_vocab_size=5, k=3, dflash_block_size=5)
    torch.manual_seed(0)
    fit(d, rows, steps=30, lr=3e-3, batch_size=16)
    assert_rollouts_follow_target(target, d, [1, 3, 4, 3, 4], sp, k=3)


@pytest.mark.parametrize(
    "sp",
    [greedy(max_new=24), SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=2)],
    ids=["greedy", "sampled"],
)
def test_incremental_context_equals_a_fresh_start_at_every_step(target_lm, trained, sp):
    """The context cache after many ragged accept()s (rows accept different numbers of drafts, rows
    leave, prompts shared) gives the same drafts and q as a start() on the same sequences."""
    spy = _AgainstFresh(
        trained, target_lm, lambda d: DFlashDrafter(d.net, d.hidden_layers, d.vocab_size, d.block_size, d.ttt_decay)
    )
    prompts = PROMPTS + [PROMPTS[0], PROMPTS[3]]
    RolloutEngine(target_lm, spy, k=3).generate(prompts, sp, torch.Generator().manual_seed(3))
    assert spy.steps >= 5
    assert sum(len(set(e.tolist())) > 1 for e in spy.emitted) >= 3


def test_checkpoint_round_trip(tmp_path, target_lm, trained):
    trained.save(tmp_path / "d")
    spec = DrafterSpec(kind="dflash", draft_vocab_size=24, k=3)
    back = build_drafter("dflash", spec, DrafterTarget(target_lm, init_path=tmp_path / "d"), torch.device("cpu"))
    for (n, a), (_, b) in zip(trained.net.state_dict().items(), back.net.state_dict().items()):
        assert torch.equal(a, b), n
    with pytest.raises(ValueError, match="another target"):
        spec8 = DrafterSpec(kind="dflash", draft_vocab_size=24, k=3, dflash_block_size=6)
        build_drafter("dflash", spec8, DrafterTarget(target_lm, init_path=tmp_path / "d"), torch.device("cpu"))


def test_k_beyond_the_block_is_a_clear_error(target_lm):
    with pytest.raises(ValueError, match="dflash_block_size=8"):
        _make(target_lm, k=7, dflash_block_size=7)


def test_vllm_backend_refuses_a_k_that_leaves_the_block_part_empty():
    """vLLM runs a block of k + 1 slots, the head its trained dflash_block_size: refused before anything is
    built unless they agree (tests/test_dflash_vllm.py: the export itself)."""
    from workbench.specs import load_spec
    from workbench.specs.resolve import admission_config
    from workbench.vllm import check_vllm_run

    with pytest.raises(ValueError, match="drafter.dflash_block_size=8; set drafter.k=7"):
        check_vllm_run(
            admission_config(load_spec("quickstart", ["drafter.kind=dflash", "drafter.k=3", "rollout.backend=vllm"]))
        )
    check_vllm_run(
        admission_config(load_spec("quickstart", ["drafter.kind=dflash", "drafter.k=7", "rollout.backend=vllm"]))
    )
