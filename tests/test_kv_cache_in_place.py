"""Retiring finished rows compacts the KV caches (the target's, draft_model's, the chain drafters') in
place: the same storage, no second whole cache allocated, tokens unchanged.
"""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.rollout.engine import RolloutEngine
from workbench.rollout.kv_cache import KVCache
from workbench.rollout.model import LeanLM

from conftest import PROMPTS, greedy, random_llama


class FreshBytes(TorchDispatchMode):
    """Peak bytes of storage that ops allocated and that is still referenced, over the ops run in
    the mode. torch's CPU allocator keeps no statistics, so outputs whose storage is none of the
    op's inputs' are tracked by weak reference and summed while alive (a view or an in-place
    write returns an input's storage and counts nothing)."""

    def __init__(self):
        super().__init__()
        self.live: list[tuple[weakref.ref, int]] = []
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.live.append((weakref.ref(t), t.untyped_storage().nbytes()))
        self.live = [(r, b) for r, b in self.live if r() is not None]
        self.peak = max(self.peak, sum(b for _, b in self.live))
        return out


def _ptrs(cache: KVCache) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in cache.k + cache.v]


def _layer_bytes(cache: KVCache) -> int:
    t = cache.k[0]
    return t.numel() * t.element_size()


def test_kv_cache_retirement_compacts_in_place():
    """Dropping rows keeps every layer's storage, moves the kept rows to the front, and allocates
    at most one layer's kept rows at a time (index_select of every layer used to build a second
    cache before the first was freed: 2 x num_layers layers' worth)."""
    lm = LeanLM.from_hf(random_llama(layers=3, seed=1))
    cache = lm.new_cache(6, 20)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape))
    before, ptrs = [t.clone() for t in cache.k + cache.v], _ptrs(cache)
    keep = torch.tensor([0, 2, 3, 5])
    with FreshBytes() as mode:
        cache.select(keep)
    assert _ptrs(cache) == ptrs
    assert mode.peak <= _layer_bytes(cache)  # (one layer's 4 kept rows)
    for old, new in zip(before, cache.k + cache.v):
        assert new.shape[0] == 4 and torch.equal(new, old[keep])


def test_kv_cache_expands_within_its_capacity_and_grows_past_it():
    """The prefill's expansion (U distinct prompts -> B rows) stays in the buffers leased with
    ``capacity``; past it the cache reallocates (a growth, not a retirement)."""
    lm = LeanLM.from_hf(random_llama(layers=2, seed=1))
    cache = lm.new_cache(2, 10, capacity=5)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape))
    before, ptrs = [t.clone() for t in cache.k + cache.v], _ptrs(cache)
    idx = torch.tensor([1, 0, 1, 1, 0])
    cache.select(idx)
    assert _ptrs(cache) == ptrs and all(torch.equal(n, o[idx]) for o, n in zip(before, cache.k + cache.v))
    cache.select(torch.tensor([4, 4, 3, 2, 1, 0]))  # 6 rows > capacity 5
    assert cache.k[0].shape[0] == 6 and cache.capacity == 6 and torch.equal(cache.k[0][0], before[0][0])


def _drafter(kind, target_lm, draft_lm):
    from drafters.draft_model import DraftModelDrafter

    if kind == "draft_model":
        return DraftModelDrafter(draft_lm)
    from drafters import build_drafter
    from workbench.rollout.drafter import DrafterTarget
    from workbench.specs.drafter import DrafterSpec

    torch.manual_seed(0)
    return build_drafter(kind, DrafterSpec(kind=kind), target=DrafterTarget(target_lm), device=torch.device("cpu"))


@pytest.mark.parametrize("kind", [None, "draft_model", "eagle3", "mtp"])
def test_engine_retirement_keeps_every_cache_in_place(target_lm, draft_lm, kind, monkeypatch):
    """Through the engine: every retirement (rows leave: fewer rows after than before) of the
    target's and the drafter's caches keeps their storage and allocates at most one layer's kept
    rows; the tokens equal plain greedy decoding."""
    ar = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy(eos=None, max_new=14))
    eos = ar.tokens[0][2]  # rows stop at different steps
    ref = RolloutEngine(target_lm).generate(PROMPTS * 2, greedy(eos=eos, max_new=14))
    assert len({len(t) for t in ref.tokens}) > 1
    seen, real = [], KVCache.select

    def spy(self, rows, moved=None):
        n0, ptrs, layer = self.k[0].shape[0], _ptrs(self), _layer_bytes(self)
        with FreshBytes() as mode:
            real(self, rows, moved)
        if rows.shape[0] < n0:  # a retirement (the prefill's expansion grows the cache)
            seen.append((len(self.k), _ptrs(self) == ptrs, mode.peak <= layer * rows.shape[0] // n0))

    monkeypatch.setattr(KVCache, "select", spy)
    drafter = None if kind is None else _drafter(kind, target_lm, draft_lm)
    out = RolloutEngine(target_lm, drafter, k=3).generate(PROMPTS * 2, greedy(eos=eos, max_new=14))
    assert out.tokens == ref.tokens
    assert seen and all(same and small for _, same, small in seen), seen
    if kind is not None:  # the drafter's cache retired rows too (chain drafters: one layer)
        assert {n for n, _, _ in seen} >= (
            {target_lm.cfg.num_layers, 1} if kind != "draft_model" else {draft_lm.cfg.num_layers}
        )
