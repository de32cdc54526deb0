"""Rollout engine: logits match transformers, greedy speculative == greedy autoregressive token for
token, batched == one-at-a-time, and sampled speculative rollouts follow the target's law."""

import pytest
import torch

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama


def test_logits_match_transformers(target_hf, target_lm):
    ids = torch.randint(3, 48, (3, 14))
    ref = target_hf(ids).logits
    cache = target_lm.new_cache(3, 32)
    got, _ = target_lm(ids, torch.zeros(3, dtype=torch.long), cache)
    assert torch.allclose(got, ref, atol=1e-4)


def test_incremental_ragged_positions_match_full_forward(target_hf, target_lm):
    """One batched forward whose rows start at different positions (row 0 continues at 6, row 1
    recomputes position 5 then continues), over a cache prefilled with 6 tokens per row."""
    ids = torch.randint(3, 48, (2, 12))
    ref = target_hf(ids).logits  # (2, 12, V)
    cache = target_lm.new_cache(2, 32)
    target_lm(ids[:, :6], torch.zeros(2, dtype=torch.long), cache)
    inp = torch.stack([ids[0, 6:9], ids[1, 5:8]])  # (2, 3) ragged: columns sit at different positions per row
    got, _ = target_lm(inp, torch.tensor([6, 5]), cache)
    assert torch.allclose(got[0], ref[0, 6:9], atol=1e-4)
    assert torch.allclose(got[1], ref[1, 5:8], atol=1e-4)
    # and the cache then holds both rows correctly: one more ragged step from each row's end
    got2, _ = target_lm(torch.stack([ids[0, 9:10], ids[1, 8:9]]), torch.tensor([9, 8]), cache)
    assert torch.allclose(got2[0, 0], ref[0, 9], atol=1e-4) and torch.allclose(got2[1, 0], ref[1, 8], atol=1e-4)


def test_grouped_query_and_tied_embeddings_load():
    hf = random_llama(tie=True, seed=3)
    lm = LeanLM.from_hf(hf)
    ids = torch.randint(3, 48, (1, 9))
    got, _ = lm(ids, torch.zeros(1, dtype=torch.long), lm.new_cache(1, 16))
    assert torch.allclose(got, hf(ids).logits, atol=1e-4)


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("kind", ["draft_model", "ngram"])
def test_greedy_speculative_equals_greedy_autoregressive(target_lm, draft_lm, kind, k):
    drafter = DraftModelDrafter(draft_lm) if kind == "draft_model" else NgramDrafter(1, 3)
    ar = RolloutEngine(target_lm).generate(PROMPTS, greedy())
    sv = RolloutEngine(target_lm, drafter, k=k).generate(PROMPTS, greedy())
    assert sv.tokens == ar.tokens
    assert sv.finish_reasons == ar.finish_reasons
    for a, b in zip(ar.logprobs, sv.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert sv.counters.num_draft_tokens > 0


def test_greedy_self_drafting_accepts_everything(target_lm):
    out = RolloutEngine(target_lm, DraftModelDrafter(target_lm), k=4).generate(PROMPTS, greedy(eos=None))
    m = out.counters.metrics()
    assert m["spec/acceptance_rate"] == 1.0 and m["spec/acceptance_length"] == 5.0


def test_batched_ragged_equals_one_at_a_time(target_lm, draft_lm):
    eng = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=3)
    batched = eng.generate(PROMPTS, greedy())
    single = [eng.generate([p], greedy()).tokens[0] for p in PROMPTS]
    assert batched.tokens == single


def test_shared_prompts_prefilled_once_give_the_same_rollouts(target_lm, draft_lm):
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[3], PROMPTS[1], PROMPTS[0]]  # a GRPO-like batch
    eng = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=3)
    out = eng.generate(prompts, greedy())
    assert out.tokens == [eng.generate([p], greedy()).tokens[0] for p in prompts]
    sampled = eng.generate(prompts, SamplingParams(max_new_tokens=20), torch.Generator().manual_seed(0))
    assert len({tuple(t) for t in sampled.tokens}) > 1  # rows sharing a prompt still sample independently


@pytest.mark.parametrize("kind", ["draft_model", "mtp", "eagle3"])
def test_drafter_start_shared_per_distinct_prompt_equals_per_row(target_lm, draft_lm, kind):
    """start() on the distinct prompts expanded by prompt_index proposes what a per-row start does,
    including the entry that reads each row's own first sampled token (the chain drafters)."""
    from drafters import DrafterTarget, build_drafter
    from workbench.rollout.drafter import DraftContext
    from workbench.specs import DrafterSpec

    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[1], PROMPTS[0]]  # 2 distinct, lengths differ
    B, P, t_max = len(prompts), max(map(len, prompts)), 24
    tokens = torch.zeros(B, t_max, dtype=torch.long)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
        tokens[b, len(p)] = 5 + b  # each row's own first sampled token
    plens = torch.tensor([len(p) for p in prompts])

    def fresh():
        if kind == "draft_model":
            return DraftModelDrafter(draft_lm)
        torch.manual_seed(0)  # the same random head both times
        return build_drafter(kind, DrafterSpec(kind=kind), DrafterTarget(target_lm), torch.device("cpu"))

    def proposals(rows, index):
        d = fresh()
        u = torch.arange(B) if rows is None else rows
        _, hidden = target_lm(
            tokens[u, :P],
            torch.zeros(len(u), dtype=torch.long),
            target_lm.new_cache(len(u), t_max),
            hidden_layers=d.hidden_layers,
            logits_col=plens[u] - 1,
        )
        ctx = DraftContext(
            tokens, plens + 1, plens, torch.arange(B), greedy(), None, prompt_rows=rows, prompt_index=index
        )
        d.start(ctx, hidden)
        ctx = DraftContext(tokens, plens + 1, plens, torch.arange(B), greedy())
        return d.propose(ctx, 3)

    per_row = proposals(None, None)
    shared = proposals(torch.tensor([0, 1]), torch.tensor([0, 1, 0, 1, 0]))
    assert torch.equal(shared.tokens, per_row.tokens)
    assert torch.allclose(shared.probs, per_row.probs, atol=1e-5)


def test_drafter_contexts_are_snapshots_and_accept_gets_the_emitted_counts(target_lm, draft_lm):
    """The interface (workbench.rollout.drafter): accept's context has lens = propose's lens +
    num_emitted, and a context handed out earlier is never changed by the engine afterwards."""
    from workbench.rollout.drafter import Drafter

    class Recorder(Drafter):
        def __init__(self):
            self.inner, self.seen, self.accepts = DraftModelDrafter(draft_lm), [], 0

        def start(self, ctx, hidden):
            self.inner.start(ctx, hidden)

        def propose(self, ctx, k):
            self.seen.append((ctx, ctx.lens.clone()))
            return self.inner.propose(ctx, k)

        def accept(self, ctx, num_emitted, hidden):
            prev, lens = self.seen[-1]
            assert ctx is not prev and torch.equal(ctx.lens, lens + num_emitted)
            assert ((num_emitted >= 1) & (num_emitted <= 4)).all()
            self.accepts += 1

        def select(self, rows, moved=None):
            self.inner.select(rows, moved)

    rec = Recorder()
    RolloutEngine(target_lm, rec, k=3).generate(
        PROMPTS, SamplingParams(max_new_tokens=20), torch.Generator().manual_seed(0)
    )
    assert rec.accepts == len(rec.seen) > 3
    assert all(torch.equal(ctx.lens, lens) for ctx, lens in rec.seen)  # no context changed after its call


def test_small_max_batch_size_chunks_identically(target_lm, draft_lm):
    a = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=2).generate(PROMPTS, greedy())
    b = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=2, max_batch_size=2).generate(PROMPTS, greedy())
    assert a.tokens == b.tokens


def test_budget_and_eos_respected(target_lm, draft_lm):
    out = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=5).generate(PROMPTS, greedy(max_new=7, eos=None))
    assert all(len(t) == 7 for t in out.tokens) and set(out.finish_reasons) == {"length"}
    # pick the token greedy emits at step 3 of prompt 0 as "EOS": generation must stop right there.
    eos = out.tokens[0][3]
    out2 = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=5).generate(PROMPTS[:1], greedy(max_new=7, eos=eos))
    first = out.tokens[0].index(eos)
    assert out2.tokens[0] == out.tokens[0][: first + 1] and out2.finish_reasons == ["stop"]


def test_counters_are_consistent(target_lm, draft_lm):
    out = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=3).generate(
        PROMPTS, SamplingParams(max_new_tokens=30), torch.Generator().manual_seed(0)
    )
    c = out.counters
    assert c.num_draft_tokens == 3 * c.num_drafts
    assert c.num_accepted_tokens == sum(c.num_accepted_tokens_per_pos)
    assert all(a >= b for a, b in zip(c.num_accepted_tokens_per_pos, c.num_accepted_tokens_per_pos[1:]))
    assert c.num_generated_tokens == sum(map(len, out.tokens))


# ---------------------------------------------------------------- distribution of sampled rollouts


@pytest.mark.parametrize(
    "kind,sp",
    [
        ("draft_model", SamplingParams(temperature=1.0, max_new_tokens=3)),
        ("draft_model", SamplingParams(temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=3)),
        ("ngram", SamplingParams(temperature=1.0, max_new_tokens=3)),
    ],
)
def test_sampled_speculative_rollouts_follow_target(kind, sp):
    target_hf = random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6)
    target = LeanLM.from_hf(target_hf)
    # A draft close to the target (as a distilled one is) so drafts are often, not always, accepted.
    draft = LeanLM.from_hf(target_hf)
    draft.lm_head.weight.add_(0.3 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    drafter = DraftModelDrafter(draft) if kind == "draft_model" else NgramDrafter(1, 2)
    assert_rollouts_follow_target(target, drafter, [1, 3, 4, 3, 4], sp)


def _has_cxx() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.slow  # torch.compile of the engine
@pytest.mark.skipif(not _has_cxx(), reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_engine_matches_eager_and_sees_the_weight_sync():
    hf = random_llama(seed=3)
    target, draft = LeanLM.from_hf(hf), LeanLM.from_hf(random_llama(layers=1, seed=4))
    ar = RolloutEngine(target).generate(PROMPTS, greedy())
    sv = RolloutEngine(target, DraftModelDrafter(draft), k=3).generate(PROMPTS, greedy())
    eng = RolloutEngine(target, DraftModelDrafter(draft), k=3)
    eng.enable_compile()
    sv_c = eng.generate(PROMPTS, greedy())
    ar_c = RolloutEngine(target).generate(PROMPTS, greedy())
    assert ar_c.tokens == ar.tokens and sv_c.tokens == sv.tokens == ar.tokens
    for a, b in zip(ar.logprobs, sv_c.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    # `prepare` copies new weights in place: the compiled forward must compute with them.
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(1.05)
    q = target.model.layers[0].self_attn.q_proj
    q.weight = torch.nn.Parameter(q.weight.detach().clone(), requires_grad=False)  # replaced, not copied into
    target.load_weights(hf)  # must notice and rebuild the fused weights
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    cache = target.new_cache(1, 8)
    target(ids[:, :4], torch.zeros(1, dtype=torch.long), cache, logits_col=torch.tensor([3]))  # eager prefill
    logits, _ = target(ids[:, 4:], torch.tensor([4]), cache)  # compiled decode step
    torch.testing.assert_close(logits[0, 0], hf(ids).logits[0, -1], atol=1e-4, rtol=1e-4)


def test_enable_compile_raises_the_recompile_limit():
    """Target and draft share lm_forward's compile cache; past TorchDynamo's default of 8
    variants it would silently run eager, so enable_compile raises the limit (no compile runs here)."""
    import torch._dynamo.config as dcfg

    name = "recompile_limit" if hasattr(dcfg, "recompile_limit") else "cache_size_limit"
    old = getattr(dcfg, name)
    try:
        setattr(dcfg, name, 8)
        LeanLM.from_hf(random_llama(layers=1, seed=5)).enable_compile()
        assert getattr(dcfg, name) >= 64
    finally:
        setattr(dcfg, name, old)


def test_moving_a_compiled_model_rebuilds_its_fused_weights():
    """.to() gives every parameter new storage; the compiled step's fused weights and flat list
    must follow (rebuilt as views of the converted parameters), not keep the old tensors."""
    lm = LeanLM.from_hf(random_llama(layers=1, seed=6))
    lm.enable_compile()  # wraps only; nothing compiles here
    lm.to(torch.float64)
    a, m = lm.model.layers[0].self_attn, lm.model.layers[0].mlp
    w_qkv, w_gu = lm.__dict__["_fused"][0]
    assert w_qkv.dtype == torch.float64 and a.q_proj.weight.data_ptr() == w_qkv.data_ptr()
    assert m.gate_proj.weight.data_ptr() == w_gu.data_ptr()
    assert lm.__dict__["_flat"][4] is w_qkv and lm.__dict__["_flat"][0] is lm.model.embed_tokens.weight


def test_spec_counters_count_only_drafts_that_were_emitted(target_lm):
    """The draft model is the target itself, so under greedy every draft is accepted; with a budget
    of 4 tokens and k=6 each row's one verification step emits 3 drafts (the budget cuts the rest):
    3 accepted per row, not the 6 the rejection sampler accepted."""
    from workbench.rollout.sampling import SamplingParams

    sp = SamplingParams(temperature=0.0, max_new_tokens=4, eos_token_id=None)
    out = RolloutEngine(target_lm, DraftModelDrafter(target_lm), k=6).generate(PROMPTS, sp)
    B = len(PROMPTS)
    c = out.counters
    assert all(len(t) == 4 for t in out.tokens) and c.num_verify_steps == 1
    assert c.num_accepted_tokens == 3 * B
    assert c.num_accepted_tokens_per_pos == [B, B, B, 0, 0, 0]
    assert c.metrics()["spec/acceptance_length"] == pytest.approx(4.0)  # 1 + 3 accepted per draft step


def test_compact_order_moves_only_the_tail_into_the_holes():
    from workbench.rollout.batch import compact_order

    assert compact_order([0, 2, 3, 5, 6]) == [0, 5, 2, 3, 6]  # holes 1 and 4 take rows 5 and 6
    assert compact_order([0, 1, 2]) == [0, 1, 2] and compact_order([4, 5]) == [4, 5] and compact_order([]) == []
    live = [1, 3, 4, 8, 9, 11]
    out = compact_order(live)
    assert sorted(out) == live and sum(i != j for j, i in enumerate(out)) == sum(i >= len(live) for i in live)


@pytest.mark.parametrize("rows", [[0, 5, 2, 3, 6], [3, 1], [6, 5, 4, 3, 2, 1, 0], [0, 1, 2]])
def test_kv_cache_select_with_moved_rows_equals_a_whole_copy(rows):
    from types import SimpleNamespace

    from workbench.rollout.kv_cache import KVCache

    cfg = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=3)
    a = KVCache(cfg, 7, 5, "cpu", torch.float32)
    for t in a.k + a.v:
        t.copy_(torch.randn_like(t))
    b = KVCache(cfg, 7, 5, "cpu", torch.float32)
    for s, t in zip(a.k + a.v, b.k + b.v):
        t.copy_(s)
    want = [t[rows].clone() for t in a.k + a.v]
    r = torch.tensor(rows)
    a.select(r)
    b.select(r, torch.tensor([j for j, i in enumerate(rows) if i != j], dtype=torch.long))
    for w, x, y in zip(want, a.k + a.v, b.k + b.v):
        assert torch.equal(x, w) and torch.equal(y, w)
