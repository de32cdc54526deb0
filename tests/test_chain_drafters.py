"""mtp and eagle3 (drafters that read the target): vocabulary map, hidden-state conventions, the
training-time-test loss, checkpoints, and exactness (greedy token for token, sampled joint law)."""

import pytest
import torch

from drafters import DraftContext, Drafter, DrafterTarget, build_drafter
from drafters.eagle3 import default_layer_ids, vocab_map
from drafters.training import (
    capture_hidden,
    collate,
    completion_loss_mask,
    evaluate,
    fit,
    lean_target_states,
    split_rows,
)
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.specs import DrafterSpec

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama

KINDS = [("mtp", 1), ("mtp", 2), ("eagle3", 1)]


def _make(kind, lm, counts=None, **fields):
    spec = DrafterSpec(kind=kind, **fields)
    return build_drafter(kind, spec, DrafterTarget(lm, token_counts=counts), torch.device("cpu"))


def _rollout_rows(lm, n=96, max_new=30, seed=0, layers=()):
    """The target's own sampled completions of random 3-token prompts, as per-sequence DraftBatch rows."""
    g = torch.Generator().manual_seed(seed)
    V = lm.cfg.vocab_size
    prompts = [[1, int(a), int(b)] for a, b in torch.randint(3, V, (n, 2), generator=g)]
    out = RolloutEngine(lm).generate(prompts, SamplingParams(max_new_tokens=max_new, eos_token_id=2), g)
    seqs = [p + c for p, c in zip(prompts, out.tokens)]
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    mask = completion_loss_mask([3] * n, list(map(len, seqs)), L)
    counts = torch.bincount(ids.flatten(), minlength=V).float()
    return split_rows(lean_target_states(lm, ids, mask, layers)), counts


@pytest.fixture(scope="module")
def trained(target_lm):
    """A briefly trained drafter per (kind, modules): drafts get accepted, so exactness tests bite."""
    out = {}
    rows, counts = _rollout_rows(target_lm, layers=(0, 1, 2))
    for kind, d in KINDS:
        drafter = _make(
            kind, target_lm, counts, num_nextn_predict_layers=d, draft_vocab_size=24 if kind == "eagle3" else None
        )
        fit(drafter, rows, steps=60, lr=3e-3, batch_size=16)
        out[(kind, d)] = drafter
    return out


# ---------------------------------------------------------------- pure pieces


def test_vocab_map_round_trips_and_keeps_the_most_frequent():
    counts = torch.tensor([0, 5, 1, 9, 9, 0, 3, 2.0])
    d2t, t2d = vocab_map(counts, 4)
    assert d2t.tolist() == [1, 3, 4, 6]  # ascending target ids of the 4 most frequent
    assert (t2d[d2t] == torch.arange(4)).all()  # draft -> target -> draft
    inside = t2d >= 0
    assert (d2t[t2d[inside]] == torch.arange(8)[inside]).all()  # target -> draft -> target
    assert int(inside.sum()) == 4 and (t2d[~inside] == -1).all()
    assert vocab_map(torch.ones(5), 2)[0].tolist() == [0, 1]  # ties: lower id first
    with pytest.raises(ValueError, match="draft_vocab_size"):
        vocab_map(counts, 9)


@pytest.mark.parametrize("L,ids", [(1, (0, 0, 0)), (2, (1, 1, 1)), (4, (1, 2, 3)), (6, (2, 3, 3)), (32, (2, 16, 29))])
def test_default_eagle3_layers(L, ids):
    assert default_layer_ids(L) == ids


def test_eagle3_layer_ids_beyond_the_target_are_a_clear_error(target_lm):
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        _make("eagle3", target_lm, eagle_aux_hidden_state_layer_ids=[0, 1, 3])  # the target has 2 layers


def test_capture_hidden_matches_the_engine_convention(target_hf, target_lm):
    """Trainer-side hooks (online adaptation) see the same features as the engine (inference)."""
    ids = torch.tensor([[1, 5, 9, 12, 7, 3], [1, 30, 31, 2, 0, 0]])
    layers = (0, 1, 2)  # 2 = the last layer's output before the final norm
    with capture_hidden(target_hf, layers) as cap, torch.no_grad():
        target_hf(ids)
    _, hidden = target_lm(ids, torch.zeros(2, dtype=torch.long), target_lm.new_cache(2, 6), hidden_layers=layers)
    for i in layers:
        torch.testing.assert_close(cap.hidden[i][0], hidden[i], atol=1e-4, rtol=1e-4)


def test_eagle3_proposals_are_distributions_over_the_target_vocab(target_lm, trained):
    d = trained[("eagle3", 1)]
    captured = []
    orig = d.propose

    def spy(ctx, k):
        captured.append(orig(ctx, k))
        return captured[-1]

    d.propose = spy
    try:
        RolloutEngine(target_lm, d, k=3).generate(
            PROMPTS, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0)
        )
    finally:
        del d.propose
    outside = d.net.t2d < 0
    assert captured and int(outside.sum()) == target_lm.cfg.vocab_size - 24
    for prop in captured:
        torch.testing.assert_close(prop.probs.sum(-1), torch.ones_like(prop.probs.sum(-1)))
        assert (prop.probs[..., outside] == 0).all()
        assert (d.net.t2d[prop.tokens] >= 0).all()  # drafted ids lie in the draft vocabulary


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_ttt_loss_decreases_on_a_fixed_batch(target_lm, kind):
    rows, counts = _rollout_rows(target_lm, n=16, layers=(0, 1, 2))
    d = _make(kind, target_lm, counts)
    batch = collate(rows)
    before = evaluate(d, batch)
    fit(d, rows, steps=40, lr=3e-3, batch_size=16)
    after = evaluate(d, batch)
    assert after["draft/loss"] < 0.7 * before["draft/loss"]
    assert after["draft/top1_agreement"] > before["draft/top1_agreement"]
    assert all(f"draft/loss_step_{j}" in after for j in range(7))


def test_online_adaptation_updates_every_n_steps_from_a_bounded_buffer(target_lm):
    from workbench.grpo.online import OnlineAdaptation
    from workbench.specs import DrafterOnlineSpec

    rows, counts = _rollout_rows(target_lm, n=12, layers=(0, 1, 2))
    d = _make("eagle3", target_lm, counts)
    online = OnlineAdaptation(
        d, DrafterOnlineSpec(enabled=True, every=2, steps=2, batch_size=4, buffer_size=20), seed=0
    )
    before = [p.detach().clone() for p in d.train_parameters()]
    assert online.update(1, collate(rows)) == {}  # not due: only buffered
    assert len(online.buffer) == 12 and all(torch.equal(a, b) for a, b in zip(before, d.train_parameters()))
    out = online.update(2, collate(rows))
    assert {"draft/loss", "draft/top1_agreement", "draft/heldout_loss", "draft/buffer_size"} <= set(out)
    assert out["draft/buffer_size"] == 20.0  # FIFO bound
    assert any(not torch.equal(a, b) for a, b in zip(before, d.train_parameters()))


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_checkpoint_round_trip(tmp_path, trained, target_lm, kind):
    d = trained[(kind, 1)]
    d.save(tmp_path / kind)
    spec = DrafterSpec(kind=kind)
    e = build_drafter(kind, spec, DrafterTarget(target_lm, init_path=tmp_path / kind), torch.device("cpu"))
    for (n1, a), (n2, b) in zip(d.net.state_dict().items(), e.net.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b)
    sv1 = RolloutEngine(target_lm, d, k=3).generate(PROMPTS, greedy())
    sv2 = RolloutEngine(target_lm, e, k=3).generate(PROMPTS, greedy())
    assert sv1.counters.num_accepted_tokens == sv2.counters.num_accepted_tokens
    with pytest.raises(ValueError, match="drafter.init"):
        other = "eagle3" if kind == "mtp" else "mtp"
        build_drafter(
            other, DrafterSpec(kind=other), DrafterTarget(target_lm, init_path=tmp_path / kind), torch.device("cpu")
        )


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("kind,modules", KINDS)
def test_greedy_speculative_equals_greedy_autoregressive(target_lm, trained, kind, modules, k):
    d = trained[(kind, modules)]
    ar = RolloutEngine(target_lm).generate(PROMPTS, greedy())
    sv = RolloutEngine(target_lm, d, k=k).generate(PROMPTS, greedy())
    assert sv.tokens == ar.tokens and sv.finish_reasons == ar.finish_reasons
    for a, b in zip(ar.logprobs, sv.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert sv.counters.num_accepted_tokens > 0  # trained drafts do get accepted


def test_batched_ragged_equals_one_at_a_time(target_lm, trained):
    eng = RolloutEngine(target_lm, trained[("eagle3", 1)], k=3)
    batched = eng.generate(PROMPTS, greedy())
    assert batched.tokens == [eng.generate([p], greedy()).tokens[0] for p in PROMPTS]


@pytest.mark.parametrize(
    "kind,sp",
    [
        ("mtp", SamplingParams(temperature=1.0, max_new_tokens=3)),
        ("eagle3", SamplingParams(temperature=1.0, max_new_tokens=3)),
        ("eagle3", SamplingParams(temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=3)),
    ],
)
def test_sampled_speculative_rollouts_follow_target(kind, sp):
    target = LeanLM.from_hf(random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6))
    rows, counts = _rollout_rows(target, n=64, max_new=8, layers=(0, 1, 2))
    # eagle3 with 5 of 8 ids: q is zero outside its vocabulary, the rejection sampler must still be exact
    d = _make(kind, target, counts, draft_vocab_size=5 if kind == "eagle3" else None)
    fit(d, rows, steps=30, lr=3e-3, batch_size=16)
    assert_rollouts_follow_target(target, d, [1, 3, 4, 3, 4], sp)


# ---------------------------------------------------------------- incremental cache bookkeeping


class _AgainstFresh(Drafter):
    """Runs ``inner`` (a chain drafter) for the engine and, at every verification step, checks its
    proposal against a drafter over the same net rebuilt from scratch: ``start`` on each row's
    whole sequence so far (all but its last token as the prompt, the last as the first sampled
    token), with the hidden states of one teacher-forced target forward, then ``propose``."""

    def __init__(self, inner, target, rebuild=None):
        self.inner, self.target = inner, target
        # a new drafter over the same net (default: a chain drafter's constructor)
        self.rebuild = rebuild or (lambda d: type(d)(d.net, d.hidden_layers, d.vocab_size))
        self.hidden_layers = inner.hidden_layers
        self.steps, self.emitted = 0, []

    def start(self, ctx, hidden):
        self.inner.start(ctx, hidden)

    def propose(self, ctx, k):
        rng = ctx.generator.get_state() if ctx.generator is not None else None
        prop = self.inner.propose(ctx, k)
        ref = self._fresh(ctx, k, rng)
        assert torch.equal(prop.tokens, ref.tokens), f"step {self.steps}: incremental drafts differ from a fresh start"
        torch.testing.assert_close(prop.probs, ref.probs, atol=1e-5, rtol=1e-4)
        self.steps += 1
        return prop

    def _fresh(self, ctx, k, rng):
        d = self.inner
        fresh = self.rebuild(d)
        B, t_max = ctx.tokens.shape
        plens = ctx.lens - 1  # (B,) the sequence so far, but its last token, as the prompt
        P = int(plens.max())
        zeros = torch.zeros(B, dtype=torch.long)
        _, hidden = self.target(
            ctx.tokens[:, :P], zeros, self.target.new_cache(B, t_max), hidden_layers=d.hidden_layers
        )
        fresh.start(DraftContext(ctx.tokens, ctx.lens, plens, ctx.group_ids, ctx.sampling), hidden)
        gen = None
        if rng is not None:
            gen = torch.Generator()
            gen.set_state(rng)  # the same uniforms as the incremental proposal drew
        return fresh.propose(DraftContext(ctx.tokens, ctx.lens, plens, ctx.group_ids, ctx.sampling, gen), k)

    def accept(self, ctx, num_emitted, hidden):
        self.emitted.append(num_emitted.clone())
        self.inner.accept(ctx, num_emitted, hidden)

    def select(self, rows, moved=None):
        self.inner.select(rows, moved)


@pytest.mark.parametrize(
    "sp",
    [greedy(max_new=24), SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=2)],
    ids=["greedy", "sampled"],
)
@pytest.mark.parametrize("kind,modules", [("mtp", 2), ("eagle3", 1)])
def test_incremental_proposals_equal_a_fresh_start_at_every_step(target_lm, trained, kind, modules, sp):
    """The chain cache after many accept()s (ragged: rows accept different numbers of drafts, and
    rows leave) holds what a start() on the same sequences builds: same drafts, same q."""
    spy = _AgainstFresh(trained[(kind, modules)], target_lm)
    prompts = PROMPTS + [PROMPTS[0], PROMPTS[3]]  # shared prompts too (prefix-shared start)
    RolloutEngine(target_lm, spy, k=3).generate(prompts, sp, torch.Generator().manual_seed(3))
    assert spy.steps >= 5
    ragged = [e for e in spy.emitted if len(set(e.tolist())) > 1]
    assert len(ragged) >= 3, [e.tolist() for e in spy.emitted]  # acceptance differs between rows at several steps


# ---------------------------------------------------------------- large vocabularies: top-K target logits


def test_topk_logits_keep_the_head_and_the_argmax_exactly():
    from drafters.targets import TAIL_GAP, TopKLogits, target_argmax

    g = torch.Generator().manual_seed(0)
    full = torch.randn(7, 5000, generator=g) * 3  # (L, V)
    tk = TopKLogits.of(full, k=64)
    dense = tk.dense()
    assert dense.shape == (7, 5000) and tk.shape == (7, 5000)
    top = full.topk(64, -1)
    assert torch.equal(dense.gather(1, top.indices), top.values)  # the kept logits, exactly
    assert torch.equal(target_argmax(tk), full.argmax(-1)) and torch.equal(dense.argmax(-1), full.argmax(-1))
    outside = torch.ones_like(full, dtype=torch.bool).scatter_(1, top.indices, False)
    assert torch.allclose(dense[outside].view(7, -1), (top.values[:, -1:] - TAIL_GAP).expand(7, 5000 - 64))
    # the distribution: the head's probabilities renormalised, up to the (tiny) tail left at -TAIL_GAP
    p_full, p_dense = full.softmax(-1), dense.softmax(-1)
    head = p_full.gather(1, top.indices)
    assert torch.allclose(p_dense.gather(1, top.indices), head / head.sum(-1, keepdim=True), rtol=1e-4)
    assert torch.isfinite(dense[:, outside[0]].softmax(-1)).all()  # a restriction outside the head: still defined


@pytest.mark.parametrize("restricted", [False, True])
def test_sparse_losses_equal_the_dense_ones_on_the_densified_logits(restricted):
    """soft CE (eagle3/mtp, optionally over a draft vocabulary) and forward KL (draft_model) computed
    on the K kept logits equal the dense computation on the densified logits (tail at -30 nats)."""
    from drafters.eagle3 import vocab_map
    from drafters.targets import TopKLogits, forward_kl, soft_ce, target_distribution
    from workbench.models.losses import forward_kl as dense_kl

    g = torch.Generator().manual_seed(1)
    V, Vd = 3000, 700
    full = torch.randn(2, 5, V, generator=g) * 4  # (N, L, V)
    tk = TopKLogits.of(full, k=128)
    d2t, t2d = vocab_map(torch.rand(V, generator=g), Vd) if restricted else (None, None)
    draft = torch.randn(2, 5, Vd if restricted else V, generator=g)
    p_sparse, cols = target_distribution(tk, d2t, t2d)
    p_dense, none = target_distribution(tk.dense(), d2t, t2d)
    assert none is None and cols.shape == (2, 5, 128)
    assert torch.allclose(soft_ce(draft, p_sparse, cols), soft_ce(draft, p_dense), rtol=1e-4, atol=1e-4)
    mask = torch.ones(2, 5)
    student = torch.randn(2, 5, V, generator=g)
    assert torch.allclose(forward_kl(student, tk, mask), dense_kl(student, tk.dense(), mask), rtol=1e-4, atol=1e-4)


def test_rows_of_a_large_vocabulary_are_kept_compact_and_collated_as_top_k():
    from drafters.targets import TOPK, TOPK_MIN_VOCAB, DraftBatch, TopKLogits

    V, L = TOPK_MIN_VOCAB + 1, 6
    logits = torch.randn(2, L, V)
    mask = torch.zeros(2, L)
    mask[0, 1:4] = 1
    mask[1, 1:3] = 1
    rows = split_rows(DraftBatch(torch.zeros(2, L, dtype=torch.long), mask, logits, {0: torch.randn(2, L, 4)}))
    assert all(isinstance(r.target_logits, TopKLogits) for r in rows)
    assert rows[0].target_logits.values.shape == (5, TOPK) and rows[1].target_logits.values.shape == (4, TOPK)
    batch = collate(rows)
    assert isinstance(batch.target_logits, TopKLogits) and batch.target_logits.values.shape == (2, 5, TOPK)
    assert torch.equal(batch.target_logits.indices[0, :, 0], logits[0, :5].argmax(-1))
    assert batch.index(torch.tensor([1])).target_logits.values.shape == (1, 5, TOPK)
    small = split_rows(DraftBatch(torch.zeros(1, L, dtype=torch.long), mask[:1], logits[:1, :, :64], {}))
    assert isinstance(small[0].target_logits, torch.Tensor)  # small vocabularies: whole, as before


@pytest.mark.parametrize("kind", ["eagle3", "draft_model"])
def test_a_drafter_trains_on_top_k_targets(target_lm, kind):
    """The top-K path end to end on a small model (K below its vocabulary): the loss falls."""
    import drafters.targets as targets
    from drafters.draft_model import DraftModelDrafter

    rows, counts = _rollout_rows(target_lm, n=32, layers=(0, 1, 2))
    k = 8  # of SMALL_V ids
    for r in rows:
        r.target_logits = targets.TopKLogits.of(r.target_logits, k)
    if kind == "eagle3":
        drafter = _make("eagle3", target_lm, counts, draft_vocab_size=24)
    else:
        hf = random_llama(layers=1, seed=1)
        drafter = DraftModelDrafter(LeanLM.from_hf(hf), hf)
    before = evaluate(drafter, collate(rows))["draft/loss"]
    fit(drafter, rows, steps=30, lr=3e-3, batch_size=16)
    assert evaluate(drafter, collate(rows))["draft/loss"] < before
