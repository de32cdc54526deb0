"""``suffix`` drafter: proposals equal a brute-force reference (own row, siblings, history), siblings
are read only up to what they generated, the history is bounded, and speculation stays exact."""

import random
from collections import Counter

import pytest
import torch

from drafters.suffix import SuffixDrafter
from drafters.suffix_tree import RolloutHistory, SuffixTrie, speculate
from workbench.rollout.drafter import DraftContext
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama

# ---------------------------------------------------------------- the reference: slow and obvious


def reference_draft(corpus, own, k, depth, factor, min_prob):
    """Suffix decoding by enumeration. ``corpus``: every sequence the row may read (its own prompt +
    completion so far included), as lists of ints; ``own``: the row's sequence. For each match
    length m, list every occurrence of the row's last m tokens (+ the drafts so far) in the corpus,
    count what follows them, take the most frequent (ties: smallest id) while the running
    probability stays >= min_prob; keep the best total, ties to the longer match."""

    def occurrences(pattern):
        L = len(pattern)
        return [(s, i) for s in corpus for i in range(len(s) - L + 1) if s[i : i + L] == pattern]

    best, best_score = [], 0.0
    for m in range(1, min(len(own), depth - 1) + 1):
        n = min(k, int(factor * m + 1e-6), depth - m)
        toks, prob, score = [], 1.0, 0.0
        while len(toks) < n:
            pattern = own[len(own) - m :] + toks
            occ = occurrences(pattern)
            nxt = Counter(s[i + len(pattern)] for s, i in occ if i + len(pattern) < len(s))
            if not nxt:
                break
            tok = min(nxt, key=lambda t: (-nxt[t], t))
            prob *= nxt[tok] / len(occ)
            if prob < min_prob:
                break
            toks.append(tok)
            score += prob
        if score > 0 and score >= best_score:
            best, best_score = toks, score
    return best


# ---------------------------------------------------------------- the pure structure, by hand


def draft_of(seqs, own, k=3, depth=24, factor=1.0, min_prob=0.1):
    trie = SuffixTrie(depth)
    for s in seqs:
        trie.extend_many([], s)
    return speculate(trie, trie.extend_many([], own), k, factor, min_prob).tokens


def test_continuation_of_the_longest_agreeing_match():
    # "2 3" occurred before followed by 4 5; the row ends in "2 3"
    assert draft_of([[9, 2, 3, 4, 5]], [7, 2, 3]) == [4, 5]  # m=2 allows 2 drafts (factor 1)
    assert draft_of([[9, 2, 3, 4, 5]], [7, 2, 3], factor=0.5) == [4]  # floor(0.5 * 2) = 1
    assert draft_of([[9, 2, 3, 4, 5]], [7, 2, 3], k=1) == [4]


def test_most_frequent_continuation_and_ties_to_the_smallest_id():
    assert draft_of([[3, 8], [3, 6], [3, 8]], [3], k=1) == [8]  # 8 twice, 6 once
    assert draft_of([[3, 8], [3, 6]], [3], k=1) == [6]  # tie: smallest id


def test_min_token_prob_stops_the_draft():
    # after "5", 6 follows 1 of 4 occurrences (3 others end there, the row's own included): p = 1/4
    seqs = [[5, 6], [5], [5]]
    assert draft_of(seqs, [5], k=1, min_prob=0.25) == [6]
    assert draft_of(seqs, [5], k=1, min_prob=0.26) == []


def test_tree_depth_bounds_match_plus_draft():
    seqs = [[1, 2, 3, 4, 5, 6]]
    assert draft_of(seqs, [1, 2, 3], k=3, depth=24) == [4, 5, 6]
    # depth 4: m=3 leaves room for 1 draft (score 1/2), m=2 for 2 ([4, 5], score 1/2 + 1/2) -> m=2 wins
    assert draft_of(seqs, [1, 2, 3], k=3, depth=4) == [4, 5]


def test_no_occurrence_no_draft():
    assert draft_of([[1, 2, 3]], [4]) == []
    with pytest.raises(ValueError, match="max_depth"):
        SuffixTrie(1)


def test_history_is_fifo_and_bounded():
    h = RolloutHistory(3)
    for i, p in enumerate([(1,), (2,), (1,), (2,), (1,)]):
        h.add(p, [i])
    assert len(h) == 3 and list(h.rollouts((1,))) == [(2,), (4,)] and list(h.rollouts((2,))) == [(3,)]
    h0 = RolloutHistory(0)
    h0.add((1,), [5])
    assert len(h0) == 0 and list(h0.rollouts((1,))) == []
    with pytest.raises(ValueError):
        RolloutHistory(-1)


# ---------------------------------------------------------------- the drafter against the reference


class Script:
    """Drives a drafter the way the engine does (start, then propose / emit / accept / select) over
    rows whose whole future is already in the token tensor, so a drafter reading past ``lens``
    would see it. Keeps the reference's view: the batch's finished rows and the history of finished
    rollouts (FIFO, at most ``cap``) as (prompt, completion) pairs."""

    def __init__(self, drafter, cap, rng):
        self.d, self.cap, self.rng, self.history = drafter, cap, rng, []
        self.drafted = Counter()  # checked proposals by number of drafts

    def batch(self, prompts, completions, k, check):
        B, T = len(prompts), max(len(p) + len(c) for p, c in zip(prompts, completions)) + 2
        tokens = torch.zeros(B, T, dtype=torch.long)  # (B, T): prompt + the whole future completion
        for b, (p, c) in enumerate(zip(prompts, completions)):
            tokens[b, : len(p) + len(c)] = torch.tensor(p + c)
        plens = torch.tensor([len(p) for p in prompts])
        full = plens + torch.tensor([len(c) for c in completions])
        orig = torch.arange(B)  # each live row's index in the batch
        lens = plens + 1  # the prefill emitted one token per row
        ctx = DraftContext(tokens, lens, plens, orig.clone(), greedy())
        ctx.prompt_rows, ctx.prompt_index = torch.arange(B), torch.arange(B)
        self.d.start(ctx, {})
        self.finished = []
        while True:
            done = lens >= full
            self.finished += [(prompts[o], completions[o]) for o in orig[done].tolist()]
            keep = (~done).nonzero().flatten()
            tokens, lens, plens, full, orig = (t[keep] for t in (tokens, lens, plens, full, orig))
            self.d.select(keep)
            if len(orig) == 0:
                break
            ctx = DraftContext(tokens, lens, plens, orig.clone(), greedy())
            prop = self.d.propose(ctx, k)
            assert prop.probs is None and prop.tokens.shape == (len(orig), k)
            if check:
                for b in range(len(orig)):
                    got = prop.tokens[b, : prop.num_draft[b]].tolist()
                    assert got == self.reference(b, tokens, lens, orig, prompts, k), (b, got)
                    self.drafted[len(got)] += 1
                    assert (prop.tokens[b, prop.num_draft[b] :] == 0).all()
            emit = torch.tensor([self.rng.randint(1, k + 1) for _ in range(len(orig))])
            emit = torch.minimum(emit, full - lens)  # cut at each row's end, as the engine cuts at EOS/budget
            lens += emit
            self.d.accept(DraftContext(tokens, lens.clone(), plens, orig.clone(), greedy()), emit, {})
        h = self.history + self.finished
        self.history = h[max(0, len(h) - self.cap) :] if self.cap else []

    def reference(self, b, tokens, lens, orig, prompts, k):
        prompt = prompts[int(orig[b])]
        own = tokens[b, : lens[b]].tolist()
        sibs = [tokens[j, : lens[j]].tolist() for j in range(len(lens)) if j != b and prompts[int(orig[j])] == prompt]
        done = [p + c for p, c in self.finished + self.history if p == prompt]  # finished siblings, then history
        return reference_draft([own, *sibs, *done], own, k, self.d.max_depth, self.d.factor, self.d.min_prob)


def random_batch(rng, n_prompts, group, V):
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 6))] for _ in range(n_prompts)]
    return [p for p in prompts for _ in range(group)]


def random_completions(rng, n, V, max_len=20):
    return [[rng.randrange(V) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


@pytest.mark.parametrize("source", ["own", "siblings", "history", "all"])
def test_proposals_equal_the_brute_force_reference(source):
    """Random token streams over tiny vocabularies (many matches of every length): own row only
    (distinct prompts, no history), siblings (groups of 4), history (each prompt once per batch,
    over 3 batches), all at once; several tree depths, factors, thresholds and k."""
    rng = random.Random(["own", "siblings", "history", "all"].index(source))
    group = 4 if source in ("siblings", "all") else 1
    cap = 0 if source in ("own", "siblings") else 12
    drafted = Counter()
    for trial in range(12):
        depth, factor, k = [3, 5, 24][trial % 3], [1.0, 0.5, 2.0][trial % 3], 1 + trial % 4
        min_prob = [0.1, 0.0, 0.4][trial // 2 % 3]
        d = SuffixDrafter(depth, factor, min_prob, cap)
        script = Script(d, cap, rng)
        V = 2 + trial % 3
        prompts = random_batch(rng, 4, group, V)
        for _ in range(3 if cap else 1):
            script.batch(prompts, random_completions(rng, len(prompts), V), k, check=True)
        assert len(d.history) == min(cap, 3 * len(prompts))
        drafted += script.drafted
    # empty and multi-token drafts were checked
    assert drafted[0] > 0 and sum(n for c, n in drafted.items() if c >= 2) > 20


def test_siblings_are_read_only_up_to_what_they_generated():
    """Rows 0 and 1 share the prompt and have generated [5]; row 1's tensor already holds its future
    9 9 9. Nothing continues "5" yet: no drafts. Then row 0 emits 8 and row 1 its first 9: row 1's
    "5 9" is followed by 9 only in its future, so still no drafts (start and accept both read only
    up to lens). A row at "3 5" beside row 1 at "3 5 9" drafts exactly [9], not [9, 9, 9]."""
    tokens = torch.tensor([[1, 2, 3, 5, 0, 0, 0], [1, 2, 3, 5, 9, 9, 9]])
    plens, lens, groups = torch.tensor([3, 3]), torch.tensor([4, 4]), torch.tensor([0, 0])
    d = SuffixDrafter(max_cached_requests=0)
    ctx = DraftContext(tokens, lens, plens, groups, greedy())
    d.start(ctx, {})
    assert d.propose(ctx, 3).num_draft.tolist() == [0, 0]
    tokens[0, 4] = 8
    lens += 1  # row 0 emitted 8, row 1 its 9
    d.accept(DraftContext(tokens, lens.clone(), plens, groups, greedy()), torch.tensor([1, 1]), {})
    assert d.propose(DraftContext(tokens, lens, plens, groups, greedy()), 3).num_draft.tolist() == [0, 0]

    tokens[0, 4] = 0
    ctx = DraftContext(tokens, torch.tensor([4, 5]), plens, groups, greedy())
    d2 = SuffixDrafter(max_cached_requests=0)
    d2.start(ctx, {})
    prop = d2.propose(ctx, 3)
    assert prop.tokens[0, : prop.num_draft[0]].tolist() == [9]


@pytest.mark.parametrize("cap,expected", [(1, []), (2, [8, 9])])
def test_history_eviction_bound(cap, expected):
    """Rollouts of prompt [1, 2]: [7, 8, 9], then [4, 4]. With room for one, the first is evicted
    and a later row that starts with 7 has nothing to continue it; with room for two it drafts 8 9."""
    d = SuffixDrafter(max_cached_requests=cap)
    script = Script(d, cap, random.Random(0))
    script.batch([[1, 2]], [[7, 8, 9]], 3, check=False)
    script.batch([[1, 2]], [[4, 4]], 3, check=False)
    assert len(d.history) == cap
    tokens = torch.tensor([[1, 2, 7, 0, 0, 0]])
    ctx = DraftContext(tokens, torch.tensor([3]), torch.tensor([2]), torch.tensor([0]), greedy())
    d.start(ctx, {})
    prop = d.propose(ctx, 3)
    assert prop.tokens[0, : prop.num_draft[0]].tolist() == expected


# ---------------------------------------------------------------- exactness in the engine


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_greedy_autoregressive(target_lm, k):
    """GRPO-like batches (each prompt 3 times, group ids), twice: the second call drafts from the
    first's rollouts too. Also in chunks of 4 rows (groups split across chunks)."""
    prompts = [p for p in PROMPTS for _ in range(3)]
    groups = [i for i in range(len(PROMPTS)) for _ in range(3)]
    ar = RolloutEngine(target_lm).generate(prompts, greedy())
    for max_batch in (256, 4):
        eng = RolloutEngine(target_lm, SuffixDrafter(), k=k, max_batch_size=max_batch)
        for _ in range(2):
            sv = eng.generate(prompts, greedy(), group_ids=groups)
            assert sv.tokens == ar.tokens and sv.finish_reasons == ar.finish_reasons
            for a, b in zip(ar.logprobs, sv.logprobs):
                assert a == pytest.approx(b, abs=1e-5)
            assert sv.counters.num_accepted_tokens > 0


@pytest.mark.slow  # ~65 s each on the 2-core CPU (docs/testing.md)
@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=1.0, max_new_tokens=3),
        SamplingParams(temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=3),
    ],
)
def test_sampled_speculative_rollouts_follow_target(sp):
    """30k rows of one prompt: every row drafts from the prompt, its own tokens and the tokens its
    siblings sampled (a sibling one step ahead proposes what it drew), so drafts depend on other
    rows' random draws; the law of each row must still be the target's."""
    target = LeanLM.from_hf(random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6))
    assert_rollouts_follow_target(target, SuffixDrafter(), [1, 3, 4, 3, 4], sp)


# ---------------------------------------------------------------- spec and end to end


def test_spec_fields_and_validation():
    from pydantic import ValidationError

    from workbench.specs import DrafterSpec

    s = DrafterSpec(kind="suffix")
    assert (
        s.suffix_decoding_max_tree_depth,
        s.suffix_decoding_max_spec_factor,
        s.suffix_decoding_min_token_prob,
        s.suffix_decoding_max_cached_requests,
    ) == (24, 1.0, 0.1, 10000)
    d = SuffixDrafter.from_spec(
        DrafterSpec(kind="suffix", suffix_decoding_max_tree_depth=8, suffix_decoding_max_cached_requests=5)
    )
    assert d.max_depth == 8 and d.history.max_requests == 5
    for bad in (
        {"suffix_decoding_max_tree_depth": 1},
        {"suffix_decoding_max_spec_factor": 0.0},
        {"suffix_decoding_min_token_prob": 1.5},
        {"suffix_decoding_max_cached_requests": -1},
    ):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            DrafterSpec(kind="suffix", **bad)


def test_wb_run_micro_suffix(store):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["run", "micro", "drafter.kind=suffix", "grpo.steps=2", "--quiet"])
    assert res.exit_code == 0, res.output
    run = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])[0]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["spec/acceptance_length"] >= 1.0 and run.data.metrics["spec/num_drafts"] > 0
    assert (
        run.data.params["drafter.kind"] == "suffix"
        and run.data.params["drafter.suffix_decoding_max_tree_depth"] == "24"
    )
