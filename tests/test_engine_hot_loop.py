"""The engine's hot loop reads the device once per step; batch-size buckets and a k policy leave
rollouts unchanged (greedy, token for token)."""

from contextlib import contextmanager

import pytest
import torch

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from workbench.rollout.engine import RolloutEngine

from conftest import PROMPTS, greedy

# Tensor methods that move a value to the host (a CUDA synchronisation when the tensor is on a GPU).
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


@contextmanager
def count_host_reads():
    counts = {"n": 0}
    saved = {m: getattr(torch.Tensor, m) for m in READS}

    def wrap(fn):
        def counted(self, *a, **kw):
            counts["n"] += 1
            return fn(self, *a, **kw)

        return counted

    try:
        for m, fn in saved.items():
            setattr(torch.Tensor, m, wrap(fn))
        yield counts
    finally:
        for m, fn in saved.items():
            setattr(torch.Tensor, m, fn)


def reads_per_step(engine, prompts, sp):
    """Host reads of each step after the prefill: a list, one entry per batched forward."""
    steps = engine.generate_steps(prompts, sp, torch.Generator().manual_seed(0))
    next(steps)  # prefill (reads allowed: it runs once)
    per_step = []
    while True:
        with count_host_reads() as c:
            try:
                next(steps)
            except StopIteration:
                break
        per_step.append(c["n"])
    return per_step


@pytest.mark.parametrize("kind", ["none", "ngram", "draft_model", "mtp", "eagle3"])
def test_one_host_read_per_step(target_lm, draft_lm, kind):
    if kind in ("mtp", "eagle3"):
        from drafters import build_drafter
        from workbench.rollout.drafter import DrafterTarget
        from workbench.specs.drafter import DrafterSpec

        drafter = build_drafter(
            kind,
            DrafterSpec(kind=kind, draft_vocab_size=None),
            target=DrafterTarget(target_lm),
            device=torch.device("cpu"),
        )
    else:
        drafter = {"none": None, "ngram": NgramDrafter(1, 3), "draft_model": DraftModelDrafter(draft_lm)}[kind]
    per_step = reads_per_step(RolloutEngine(target_lm, drafter, k=3), PROMPTS, greedy(max_new=16))
    assert len(per_step) >= 4
    # the last step also collects the finished rows (one read per field)
    assert all(n == 1 for n in per_step[:-1]), per_step


def test_the_counter_sees_a_planted_read(target_lm):
    """The counting harness itself: an extra .item() in the loop is seen."""
    eng = RolloutEngine(target_lm, NgramDrafter(1, 3), k=3)
    propose = eng.drafter.propose

    def leaky(ctx, k):
        ctx.lens.max().item()
        return propose(ctx, k)

    eng.drafter.propose = leaky
    assert max(reads_per_step(eng, PROMPTS, greedy(max_new=16))[:-1]) >= 2


@pytest.mark.parametrize("kind", ["none", "ngram", "draft_model"])
def test_retire_buckets_give_the_same_rollouts(target_lm, draft_lm, kind):
    prompts = PROMPTS * 3  # rows finish at different steps (EOS), so the batch shrinks step by step
    make = lambda: {"none": None, "ngram": NgramDrafter(1, 3), "draft_model": DraftModelDrafter(draft_lm)}[kind]  # noqa: E731
    plain = RolloutEngine(target_lm, make(), k=3).generate(prompts, greedy())
    buckets = (1, 2, 4, 8)
    out = RolloutEngine(target_lm, make(), k=3, retire_buckets=buckets).generate(prompts, greedy())
    assert out.tokens == plain.tokens and out.finish_reasons == plain.finish_reasons
    for a, b in zip(out.logprobs, plain.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert len(set(map(len, plain.tokens))) > 1  # the test needs ragged lengths
    seen = set(out.counters.rows_per_forward)
    assert seen <= set(buckets) | {len(prompts)}, seen  # every step ran at a bucket (or the full batch)
    assert set(plain.counters.rows_per_forward) - set(buckets)  # without buckets it would not
    if kind != "none":  # finished rows kept in the batch propose, but their drafts are not counted
        assert out.counters.num_drafts == plain.counters.num_drafts
        assert out.counters.num_accepted_tokens == plain.counters.num_accepted_tokens


class Scripted:
    """A k policy that plays a fixed sequence of k_t and records what it was told."""

    def __init__(self, script):
        self.script, self.i, self.told = script, 0, []

    def choose(self, num_rows):
        k = self.script[self.i % len(self.script)]
        self.i += 1
        return k

    def update(self, k_t, num_rows, num_drafts, accepted_per_pos):
        self.told.append((k_t, num_rows, num_drafts, list(accepted_per_pos)))


def test_k_policy_varies_k_per_step_and_stays_exact(target_lm):
    ar = RolloutEngine(target_lm).generate(PROMPTS, greedy())
    policy = Scripted([3, 0, 1, 2, 0, 0, 3])
    out = RolloutEngine(target_lm, NgramDrafter(1, 3), k=3, k_policy=policy).generate(PROMPTS, greedy())
    assert out.tokens == ar.tokens
    c = out.counters
    assert c.k_per_step == [t[0] for t in policy.told] and c.k_per_step[:7] == [3, 0, 1, 2, 0, 0, 3]
    assert all(len(t[3]) == t[0] for t in policy.told)  # accepted per position: k_t entries
    assert [t[1] for t in policy.told] == c.rows_per_forward
    assert sum(sum(t[3]) for t in policy.told) == c.num_accepted_tokens
    assert sum(t[2] for t in policy.told if t[0] == 0) == 0  # a k_t = 0 step drafts nothing


def _pooled(lm):
    """A LeanLM whose caches come from a static pool (what enable_compile(cuda_graphs=True) sets
    up), forwards left eager: the cache machinery of CUDA graphs, testable on the CPU."""
    import copy

    from workbench.rollout.graphs import StaticCachePool

    pooled = copy.copy(lm)
    pooled.__dict__["_pool"] = StaticCachePool()
    return pooled


def test_static_cache_pool_leases_free_buffers_only(target_lm):
    lm = _pooled(target_lm)
    a = lm.new_cache(2, 64, capacity=4)
    b = lm.new_cache(2, 64, capacity=4)
    assert a.k[0].data_ptr() != b.k[0].data_ptr()  # both alive: never the same buffer
    ptr = a.k[0].data_ptr()
    del a
    c = lm.new_cache(3, 64)
    assert c.k[0].data_ptr() == ptr  # a's buffer is free again and reused
    c.k[0][:3] = torch.arange(3.0)[:, None, None, None]
    c.select(torch.tensor([2, 0, 2, 1]))  # in place, growing to the capacity (prefix sharing)
    assert c.k[0].data_ptr() == ptr and c.k[0].shape[0] == 4
    assert c.k[0][:, 0, 0, 0].tolist() == [2.0, 0.0, 2.0, 1.0]


@pytest.mark.parametrize("kind", ["none", "draft_model"])
def test_pooled_caches_and_buckets_give_the_same_rollouts(target_lm, draft_lm, kind):
    """What rollout.cuda_graphs changes besides the compile mode: caches leased from a pool (reused
    across generations, compacted in place, rounded lengths) and batch-size buckets."""
    from workbench.rollout.graphs import capture_sizes
    from workbench.rollout.paired import generate_interleaved

    prompts = [PROMPTS[0]] * 3 + PROMPTS  # shared prompts: the prefill expands U rows to B in place
    make = lambda lm, d: RolloutEngine(lm, d, k=3, retire_buckets=capture_sizes(8))  # noqa: E731
    plain = RolloutEngine(target_lm, DraftModelDrafter(draft_lm) if kind == "draft_model" else None, k=3).generate(
        prompts, greedy()
    )
    lm = _pooled(target_lm)
    draft = _pooled(draft_lm) if kind == "draft_model" else None
    eng = make(lm, DraftModelDrafter(draft) if draft is not None else None)
    for _ in range(2):  # the second generation reuses the first one's buffers
        assert eng.generate(prompts, greedy()).tokens == plain.tokens
    # a speculative and a plain engine interleaved on one pooled target never share a buffer
    ar = RolloutEngine(target_lm).generate(prompts, greedy())
    (spec_out, ar_out), _ = generate_interleaved(
        [eng.generate_steps(prompts, greedy()), make(lm, None).generate_steps(prompts, greedy())], lambda: 0.0
    )
    assert spec_out.tokens == plain.tokens and ar_out.tokens == ar.tokens


def _has_cxx() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.slow  # torch.compile in the CUDA-graphs mode
@pytest.mark.skipif(not _has_cxx(), reason="torch.compile on CPU needs a C++ compiler")
def test_cuda_graphs_compile_mode_runs_the_same_rollouts_on_cpu():
    """enable_compile(cuda_graphs=True): reduce-overhead compile, pooled caches, capture-size
    buckets. torch records graphs only on CUDA; here the rest of that path must give the same tokens."""
    from workbench.rollout.graphs import capture_sizes
    from workbench.rollout.model import LeanLM

    from conftest import random_llama

    target = LeanLM.from_hf(random_llama(seed=5))
    ar = RolloutEngine(target, NgramDrafter(1, 3), k=3).generate(PROMPTS * 2, greedy())
    eng = RolloutEngine(target, NgramDrafter(1, 3), k=3, max_batch_size=8)
    eng.enable_compile(cuda_graphs=True)
    assert target.cuda_graphs and eng.retire_buckets == capture_sizes(8) == (1, 2, 4, 8)
    out = eng.generate(PROMPTS * 2, greedy())
    assert out.tokens == ar.tokens
    assert set(out.counters.rows_per_forward) <= {1, 2, 4, 8}


def test_cuda_graphs_refused_on_cpu(store):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["run", "micro", "rollout.cuda_graphs=true", "grpo.steps=1", "--quiet"])
    assert res.exit_code != 0
    assert "rollout.cuda_graphs" in res.output and "CUDA device" in res.output
