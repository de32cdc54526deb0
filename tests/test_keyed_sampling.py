"""Drafter-invariant sampling (``rollout.sampler=keyed``; Daliri, Musco and Suresh 2024, arXiv 2408.07978).

Three ways, as docs/exactness.md says: (a) the law: the keyed Gumbel-max sampler draws each token
from the processed p (chi-square over many seeds), positions independently (joint of three
positions against the product), deterministically per (seed, position); (b) the verifier: accept
iff the draft equals the keyed sample, and speculative keyed decoding equals plain keyed decoding on
a pure model; (c) identity through the engine: plain and speculative completions with the same seeds
are token for token equal for every drafter kind built here, where today's rejection sampler's are
not; (d) acceptance of deterministic drafts agrees in law with rejection sampling's.
False-alarm rate per statistical test: ALPHA = 1e-4.
"""

from collections import Counter

import pytest
import torch
from scipy import stats

from drafters import DrafterTarget, build_drafter
from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from drafters.suffix import SuffixDrafter
from drafters.training import completion_loss_mask, fit, lean_target_states, split_rows
from workbench.rollout.drafter import Drafter
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.keyed import (
    BLOCK,
    derive_seed,
    keyed_sample,
    keyed_uniform,
    keyed_verify,
    mix64,
    row_seeds,
    seeded,
)
from workbench.rollout.model import LeanLM
from workbench.rollout.paired import generate_interleaved
from workbench.rollout.sampling import SamplingParams, probs_from_logits
from workbench.rollout.workbench_backend import WorkbenchBackend
from workbench.specs import DrafterSpec

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, perturbed_draft, random_llama

ALPHA = 1e-4
V = 8


def rand_dist(*shape, seed=0, sharp=1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * sharp).softmax(-1)


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``samples`` (N,) long against ``probs`` (C,); fails on a zero-probability draw."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token of zero probability"
    exp = expected[keep].numpy()
    return stats.chisquare(counts[keep].numpy(), exp * samples.numel() / exp.sum()).pvalue


def seeds_of(n, offset=0):
    return torch.tensor([derive_seed(7, offset + i) for i in range(n)])


# ---------------------------------------------------------------- (a) the hash and the law


def test_mix64_matches_splitmix64_reference():
    """The int64 finaliser equals splitmix64's on unsigned 64-bit words (torch's >> is arithmetic)."""

    def ref(z):
        m = (1 << 64) - 1
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    xs = [0, 1, 2, 12345, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0x9E3779B97F4A7C15]
    signed = torch.tensor([x - (1 << 64) if x >= 1 << 63 else x for x in xs])
    got = [v & ((1 << 64) - 1) for v in mix64(signed).tolist()]
    assert got == [ref(x) for x in xs]


def test_keyed_uniforms_are_uniform_in_the_open_interval():
    u = keyed_uniform(seeds_of(400), torch.arange(5).expand(400, 5), 100).flatten()  # 200k values
    assert u.dtype == torch.float64 and u.min() > 0 and u.max() < 1
    assert stats.kstest(u.numpy(), "uniform").pvalue > ALPHA
    # the bits of neighbouring token ids, positions and seeds are not correlated
    grid = keyed_uniform(torch.arange(2000), torch.arange(10).expand(2000, 10), 10)  # (2000, 10, 10)
    for a, b in [(grid[..., :-1], grid[..., 1:]), (grid[:, :-1], grid[:, 1:]), (grid[:-1], grid[1:])]:
        assert abs(stats.pearsonr(a.flatten().numpy(), b.flatten().numpy()).statistic) < 0.01


@pytest.mark.parametrize("pos", [0, 1, 37])
@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9, top_k=6)])
def test_keyed_sample_follows_p_over_seeds(pos, sp):
    """200k seeds: moving 1 point of probability onto or off a token adds >= 80 to the statistic."""
    N = 200_000
    p = probs_from_logits(torch.randn(V, generator=torch.Generator().manual_seed(pos)) * 1.5, sp)
    tokens = keyed_sample(p.expand(N, 1, V), seeds_of(N), torch.full((N, 1), pos))[:, 0]
    assert chi2_pvalue(tokens, p) > ALPHA


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)])
def test_two_level_sample_follows_p_across_blocks(sp):
    """Two whole blocks of BLOCK ids and a partial one, p spread over all of them (60k seeds, about 54
    expected draws a token): the block, then the token inside it, is one exact sample of p."""
    Vb, N = 2 * BLOCK + 88, 60_000
    p = probs_from_logits(torch.randn(Vb, generator=torch.Generator().manual_seed(11)) * 0.5, sp)
    seeds = seeds_of(N, 3 * 10**6)
    tokens = torch.cat([keyed_sample(p.expand(n.numel(), 1, Vb), n, torch.full((n.numel(), 1), 4))[:, 0]
                        for n in seeds.split(10_000)])  # fmt: skip
    assert (tokens // BLOCK).unique().numel() == 3
    assert chi2_pvalue(tokens, p) > ALPHA


def test_joint_of_three_positions_is_the_product():
    """One seed per row, positions 0, 1, 2 with their own p: the 512-cell joint against the product."""
    N, T = 100_000, 3
    p = rand_dist(T, V, seed=5)  # (3, V)
    x = keyed_sample(p.expand(N, T, V), seeds_of(N, 10**6), torch.arange(T).expand(N, T))  # (N, 3)
    cells = (x * torch.tensor([V * V, V, 1])).sum(1)
    joint = (p[0][:, None, None] * p[1][None, :, None] * p[2][None, None, :]).flatten()
    big = joint * N >= 5
    counts = torch.bincount(cells, minlength=V**3).double()
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).numpy()
    exp = torch.cat([joint[big], joint[~big].sum()[None]]).double().numpy() * N
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA


def test_same_seed_and_position_same_token_other_seeds_differ():
    p = rand_dist(1, 48, seed=1, sharp=0.5).expand(1000, 4, 48)
    s, pos = seeds_of(1000), torch.arange(4).expand(1000, 4)
    a = keyed_sample(p, s, pos)
    assert torch.equal(a, keyed_sample(p, s, pos))
    assert torch.equal(a[:, 2:], keyed_sample(p[:, 2:], s, pos[:, 2:]))  # a position's token: its own key only
    other = keyed_sample(p, seeds_of(1000, 5000), pos)
    agree = (a == other).double().mean().item()  # P(two independent draws agree) = sum p^2
    assert agree == pytest.approx((p[0, 0] ** 2).sum().item(), abs=0.03)
    assert (a[:, 0] != a[:, 1]).any()  # positions of one row are not one draw


def test_greedy_and_masked_tokens():
    logits = torch.randn(50, 2, V, generator=torch.Generator().manual_seed(3))
    g = probs_from_logits(logits, SamplingParams(temperature=0.0))
    assert torch.equal(keyed_sample(g, seeds_of(50), torch.zeros(50, 2, dtype=torch.long)), logits.argmax(-1))
    p = probs_from_logits(logits, SamplingParams(top_k=2))
    x = keyed_sample(p, seeds_of(50), torch.zeros(50, 2, dtype=torch.long))
    assert (p.gather(-1, x[..., None]) > 0).all()


def test_row_seeds_and_trainer_seeds():
    assert row_seeds((3, 4), 2, None) == (3, 4)
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        row_seeds((3, 4), 3, None)
    a = row_seeds(None, 5, torch.Generator().manual_seed(0))
    assert a == row_seeds(None, 5, torch.Generator().manual_seed(0)) and len(set(a)) == 5
    sp = SamplingParams(sampler="keyed")
    one = seeded(sp, 3, 10, group_ids=[0, 0, 1, 1], group_size=2)
    assert one.seeds == tuple(derive_seed(3, 10, g, s) for g, s in [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert len(set(one.seeds)) == 4 and all(0 <= x < 2**63 for x in one.seeds)
    assert seeded(sp, 3, 11, group_ids=[0, 0, 1, 1], group_size=2).seeds != one.seeds  # another step
    assert seeded(sp, 3, 10, group_ids=[0, 0], group_size=2, first_group=1).seeds == one.seeds[2:]  # a rank's shard
    plain = SamplingParams()
    assert seeded(plain, 3, 10, group_ids=[0, 0], group_size=2) is plain
    with pytest.raises(ValueError, match="rollout.sampler"):
        SamplingParams(sampler="gumbel")


# ---------------------------------------------------------------- (b) the verifier


def test_keyed_verify_accepts_iff_the_draft_is_the_keyed_sample():
    B, k = 6, 3
    p = rand_dist(B, k + 1, V, seed=9, sharp=0.3)
    seed, pos0 = seeds_of(B), torch.tensor([0, 4, 9, 0, 2, 5])
    keyed = keyed_sample(p, seed, pos0[:, None] + torch.arange(k + 1))
    drafts = keyed[:, :k].clone()
    wrong = (keyed[:, :k] + 1) % V
    drafts[1, 0] = wrong[1, 0]  # row 1: mismatch at 0 -> nothing accepted
    drafts[2, 1] = wrong[2, 1]  # row 2: mismatch at 1 -> one accepted, then the keyed correction
    drafts[3, 2] = wrong[3, 2]
    drafts[4, 0] = wrong[4, 0]  # row 4: later drafts right do not count after a mismatch
    num_draft = torch.tensor([3, 3, 3, 3, 3, 1])  # row 5: one real draft, then plain keyed samples
    n_acc, tokens = keyed_verify(p, drafts, num_draft, seed, pos0)
    assert n_acc.tolist() == [3, 0, 1, 2, 0, 1]
    assert torch.equal(tokens, keyed)  # accepted drafts, the correction and the bonus are the keyed samples
    zero = keyed_verify(p, drafts, torch.zeros(B, dtype=torch.long), seed, pos0)
    assert zero[0].tolist() == [0] * B and torch.equal(zero[1], keyed)


def _markov(seed=0, sharp=1.2):
    """A pure model: p(next | last token) from a fixed (V, V) table."""
    return rand_dist(V, V, seed=seed, sharp=sharp)


def _plain(table, seeds, first, n):
    out = [first]
    for t in range(1, n):
        out.append(keyed_sample(table[out[-1]][:, None], seeds, torch.full((len(seeds), 1), t))[:, 0])
    return torch.stack(out, 1)  # (B, n)


def _speculative(table, seeds, first, n, k, draft_fn):
    """Keyed verification with drafts from ``draft_fn(last (B,), j) -> (B,)``: rows emit ragged
    counts, each sequence as a list."""
    B = len(seeds)
    seqs = [[int(f)] for f in first]
    while min(map(len, seqs)) < n:
        last = torch.tensor([s[-1] for s in seqs])
        drafts, prev = [], last
        for j in range(k):
            prev = draft_fn(prev, j)
            drafts.append(prev)
        d = torch.stack(drafts, 1)  # (B, k)
        ctx = torch.cat([last[:, None], d], 1)  # the token before each verified position
        p = table[ctx]  # (B, k+1, V)
        pos0 = torch.tensor([len(s) for s in seqs])
        n_acc, tok = keyed_verify(p, d, torch.full((B,), k), seeds, pos0)
        for b in range(B):
            seqs[b] += tok[b, : n_acc[b] + 1].tolist()
    return torch.tensor([s[:n] for s in seqs])


@pytest.mark.parametrize("k", [1, 3, 7])
def test_keyed_speculative_equals_keyed_plain_on_a_pure_model(k):
    table, B, n = _markov(), 300, 25
    seeds = seeds_of(B, 77)
    first = keyed_sample(table[torch.ones(B, dtype=torch.long)][:, None], seeds, torch.zeros(B, 1, dtype=torch.long))[
        :, 0
    ]
    plain = _plain(table, seeds, first, n)
    g = torch.Generator().manual_seed(k)
    drafters = {
        "argmax of a perturbed table": lambda prev, j, q=(table + 0.2 * _markov(1)).argmax(-1): q[prev],
        "random tokens": lambda prev, j: torch.randint(0, V, prev.shape, generator=g),
        "the target itself, sampled": lambda prev, j: torch.multinomial(table[prev], 1, generator=g)[:, 0],
    }
    for name, fn in drafters.items():
        assert torch.equal(_speculative(table, seeds, first, n, k, fn), plain), name


# ---------------------------------------------------------------- (c) identity through the engine

SETTINGS = {
    "T0.7": dict(temperature=0.7),
    "T1-top_p0.95": dict(temperature=1.0, top_p=0.95),
}


@pytest.fixture(scope="module")
def models():
    hf = random_llama(seed=0)
    return LeanLM.from_hf(hf), perturbed_draft(hf, 0.3)


@pytest.fixture(scope="module")
def eagle3(models):
    """A briefly trained eagle3 head (its drafts get accepted) on the target's own sampled completions."""
    target = models[0]
    g = torch.Generator().manual_seed(0)
    prompts = [[1, int(a), int(b)] for a, b in torch.randint(3, 48, (64, 2), generator=g)]
    out = RolloutEngine(target).generate(prompts, SamplingParams(max_new_tokens=24, eos_token_id=2), g)
    seqs = [p + c for p, c in zip(prompts, out.tokens)]
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    counts = torch.bincount(ids.flatten(), minlength=48).float()
    spec = DrafterSpec(kind="eagle3", draft_vocab_size=32)
    d = build_drafter("eagle3", spec, DrafterTarget(target, token_counts=counts), torch.device("cpu"))
    mask = completion_loss_mask([3] * 64, list(map(len, seqs)), L)
    rows = split_rows(lean_target_states(target, ids, mask, (0, 1, 2)))
    fit(d, rows, steps=40, lr=3e-3, batch_size=16)
    return d


def make_drafter(kind, models, eagle3=None):
    return {
        "ngram": lambda: NgramDrafter(1, 3),
        "suffix": lambda: SuffixDrafter(),
        "draft_model": lambda: DraftModelDrafter(models[1]),
        "eagle3": lambda: eagle3,
    }[kind]()


def mismatches(a, b):
    """Rows whose completions differ, and the tokens in which they differ (position-wise, plus lengths)."""
    rows = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    toks = sum(sum(u != v for u, v in zip(a[i], b[i])) + abs(len(a[i]) - len(b[i])) for i in rows)
    return len(rows), toks


def keyed_sp(setting, n, offset=0, **kw):
    seeds = tuple(seeds_of(n, offset).tolist())
    return SamplingParams(max_new_tokens=40, eos_token_id=2, sampler="keyed", seeds=seeds, **SETTINGS[setting], **kw)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kind", ["ngram", "suffix", "draft_model", "eagle3"])
def test_speculative_equals_plain_with_the_same_seeds(models, eagle3, kind, k, setting):
    """GRPO-like groups (each prompt 8 times), continuous batching (12 slots for 40 rows): zero
    differing tokens; the drafts were accepted, so the accept path ran."""
    target = models[0]
    prompts = [p for p in PROMPTS for _ in range(8)]
    groups = [i for i in range(len(PROMPTS)) for _ in range(8)]
    sp = keyed_sp(setting, len(prompts))
    plain = RolloutEngine(target, max_batch_size=12).generate(prompts, sp, group_ids=groups)
    spec = RolloutEngine(target, make_drafter(kind, models, eagle3), k=k, max_batch_size=12).generate(
        prompts, sp, group_ids=groups
    )
    assert mismatches(plain.tokens, spec.tokens) == (0, 0)
    assert spec.finish_reasons == plain.finish_reasons
    for a, b in zip(plain.logprobs, spec.logprobs):
        assert a == pytest.approx(b, abs=1e-4)
    assert spec.counters.num_accepted_tokens > 0
    assert len({tuple(t) for t in plain.tokens}) > len(PROMPTS)  # rows sharing a prompt sample their own tokens


@pytest.mark.parametrize("kind", ["ngram", "draft_model"])
def test_todays_rejection_sampler_is_not_drafter_invariant(models, kind):
    """The identity above has teeth: with the rejection sampler and the same torch seed, speculative
    and plain completions differ (same law, other draws)."""
    target = models[0]
    prompts = [p for p in PROMPTS for _ in range(8)]
    sp = SamplingParams(max_new_tokens=40, eos_token_id=2, temperature=0.7)
    plain = RolloutEngine(target).generate(prompts, sp, torch.Generator().manual_seed(0))
    eng = RolloutEngine(target, make_drafter(kind, models), k=3)
    spec = eng.generate(prompts, sp, torch.Generator().manual_seed(0))
    rows, _ = mismatches(plain.tokens, spec.tokens)
    assert rows > len(prompts) // 2


def test_seeds_drawn_from_the_generator_are_reproducible_and_the_sampler_is_opt_in(models):
    target = models[0]
    sp = SamplingParams(max_new_tokens=20, eos_token_id=2, sampler="keyed")
    a = RolloutEngine(target).generate(PROMPTS, sp, torch.Generator().manual_seed(4))
    b = RolloutEngine(target, NgramDrafter(1, 3), k=3).generate(PROMPTS, sp, torch.Generator().manual_seed(4))
    assert a.tokens == b.tokens
    c = RolloutEngine(target).generate(PROMPTS, sp, torch.Generator().manual_seed(5))
    assert c.tokens != a.tokens
    assert SamplingParams().sampler == "rejection"


def test_the_paired_twin_decodes_the_same_completions(models):
    """As the trainer runs them: the backend and its plain twin interleaved forward by forward, one
    SamplingParams with the trainer's row seeds, different generators (the twin's stream)."""
    target = models[0]
    backend = WorkbenchBackend(target, DraftModelDrafter(models[1]), k=3, max_batch_size=16)
    prompts = [p for p in PROMPTS for _ in range(4)]
    groups = [i for i in range(len(PROMPTS)) for _ in range(4)]
    sp = SamplingParams(max_new_tokens=30, eos_token_id=2, sampler="keyed")
    sp = seeded(sp, 0, 3, group_ids=groups, group_size=4)  # run seed 0, step 3
    (out, twin), _ = generate_interleaved(
        [
            backend.generate_steps(prompts, sp, torch.Generator().manual_seed(0), groups),
            backend.plain_twin().generate_steps(prompts, sp, torch.Generator().manual_seed(1), groups),
        ],
        clock=lambda: 0.0,
    )
    assert out.tokens == twin.tokens and out.counters.num_accepted_tokens > 0


def test_keyed_speculative_rollouts_follow_the_target_law():
    """The law through the engine (30k rollouts, 3 tokens, exact joint by enumeration), speculating."""
    hf = random_llama(vocab=SMALL_V, hidden=32, seed=4, lm_head_std=0.6)
    target = LeanLM.from_hf(hf)
    sp = SamplingParams(temperature=0.9, top_k=6, max_new_tokens=3, sampler="keyed")
    assert_rollouts_follow_target(target, DraftModelDrafter(perturbed_draft(hf, 0.2)), [1, 3, 4, 3, 4], sp)
    assert_rollouts_follow_target(target, NgramDrafter(1, 2), [1, 3, 4, 3, 4, 3, 4], sp)


@pytest.mark.parametrize("mode", ["coupled", "argmax"])
def test_model_drafters_draft_coupled_or_by_argmax_when_keyed(models, mode):
    from workbench.rollout.keyed import coupled_draft

    seen = []

    class Spy(DraftModelDrafter):
        def propose(self, ctx, k):
            prop = super().propose(ctx, k)
            seen.append((prop.tokens, prop.probs, ctx.seeds, ctx.n_gen))
            return prop

    sp = SamplingParams(max_new_tokens=10, eos_token_id=2, temperature=1.0, sampler="keyed", keyed_draft=mode)
    RolloutEngine(models[0], Spy(models[1]), k=3).generate(PROMPTS, sp, torch.Generator().manual_seed(0))
    assert seen
    for t, q, seeds, n_gen in seen:
        if mode == "argmax":
            assert torch.equal(t, q.argmax(-1))
        else:  # the Gumbel-max draw of q under the target's keyed noise at each draft's completion position
            want = torch.stack([coupled_draft(q[:, j], seeds, n_gen + j) for j in range(q.shape[1])], 1)
            assert torch.equal(t, want)


# ---------------------------------------------------------------- (d) acceptance of deterministic drafts


class FirstStep(Drafter):
    """Ngram drafts; records each row's first verification step: (real drafts, accepted drafts)."""

    def __init__(self):
        self.inner, self.record, self._nd = NgramDrafter(1, 3), None, None

    def start(self, ctx, hidden):
        self.record = None

    def propose(self, ctx, k):
        prop = self.inner.propose(ctx, k)
        self._nd = prop.num_draft
        return prop

    def accept(self, ctx, num_emitted, hidden):
        if self.record is None:  # every row is live in the first step (EOS off, budget past it)
            self.record = list(zip(self._nd.tolist(), (num_emitted - 1).tolist()))


def test_acceptance_of_deterministic_drafts_agrees_with_rejection_sampling(models):
    """10k rows per arm of one prompt, the target's own greedy continuation, so the ngram drafts from
    it and is accepted about half the time: the first step's (drafts, accepted) joint under keyed
    verification and under rejection sampling, two-sample chi-square, and Welch's t on the accepted
    count; first-draft acceptance sits in 0.3-0.8 (0.59 measured)."""
    target, N, k = models[0], 10_000, 3
    prompt = [1] + RolloutEngine(target).generate([[1]], SamplingParams(temperature=0.0, max_new_tokens=12)).tokens[0]
    arms = {}
    for name, sampler in [("keyed", "keyed"), ("rejection", "rejection")]:
        d, sp = FirstStep(), SamplingParams(temperature=1.0, max_new_tokens=5, sampler=sampler)  # EOS off
        RolloutEngine(target, d, k=k, max_batch_size=N).generate([prompt] * N, sp, torch.Generator().manual_seed(11))
        arms[name] = d.record
    cells = sorted(set(arms["keyed"]) | set(arms["rejection"]))
    table = [[Counter(arms[a])[c] for c in cells] for a in arms]
    assert stats.chi2_contingency(table).pvalue > ALPHA
    acc = {a: torch.tensor([n for _, n in arms[a]], dtype=torch.float64) for a in arms}
    assert stats.ttest_ind(acc["keyed"].numpy(), acc["rejection"].numpy(), equal_var=False).pvalue > ALPHA
    drafted = torch.tensor([nd for nd, _ in arms["keyed"]]) > 0
    first = (acc["keyed"][drafted] > 0).double().mean().item()
    assert 0.3 <= first <= 0.8, first


def test_keyed_sampling_is_refused_with_the_vllm_backend_naming_the_field():
    from workbench.specs import load_spec
    from workbench.specs.resolve import admission_config
    from workbench.vllm import check_vllm_run

    with pytest.raises(ValueError, match=r"rollout\.sampler=keyed .* set rollout\.sampler=rejection"):
        check_vllm_run(admission_config(load_spec("micro", ["rollout.backend=vllm", "rollout.sampler=keyed"])))
    check_vllm_run(admission_config(load_spec("micro", ["rollout.backend=vllm", "rollout.sampler=rejection"])))
