"""The exactness audit reaches the engine's options: adaptive k and retire buckets, and the compiled engine
where a C++ compiler exists (a biased verifier still fails).
"""

import shutil

import pytest
import torch

from workbench.rollout.model import LeanLM

from conftest import random_llama

AUDIT_V = 12

AUDIT_PROMPTS = [[1, 3, 4, 3, 4], [1, 5, 6]]


def _audit_models():
    """The models of tests/test_audit.py: a target and a close but different draft."""
    hf = random_llama(vocab=AUDIT_V, hidden=32, layers=1, seed=20, lm_head_std=0.6)
    target, draft = LeanLM.from_hf(hf), LeanLM.from_hf(hf)
    draft.lm_head.weight.add_(0.5 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    return target, draft


def _audit(target, drafters, n, opts, **kw):
    from workbench.audit import run_audit
    from workbench.rollout.sampling import SamplingParams

    return run_audit(
        target,
        drafters,
        kw.pop("prompts", AUDIT_PROMPTS),
        SamplingParams(temperature=1.0, max_new_tokens=3, eos_token_id=2),
        k=2,
        n=n,
        alpha=1e-3,
        engine=opts,
        **kw,
    )


def test_audit_reaches_adaptive_k_and_retire_buckets():
    """With adaptive k and retire buckets on, the audited engine chose k per step (0 included for
    the n-gram drafter, several k > 0 for the draft model) and shrank the batch to capture sizes
    with finished rows riding along, and still passes; a biased verifier still fails."""
    from drafters.draft_model import DraftModelDrafter
    from drafters.ngram import NgramDrafter
    from workbench.audit import EngineOptions, accept_all_rejection_sample
    from workbench.rollout.graphs import capture_sizes

    target, draft = _audit_models()
    opts = EngineOptions(adaptive=True, buckets=True)
    res = _audit(target, {"ngram": NgramDrafter(1, 2), "draft_model": DraftModelDrafter(draft)}, 6000, opts)
    assert res.passed, [t for t in res.tests if not t.passed]
    assert res.engine == opts and opts.label() == "adaptive+buckets"
    ks = {name: {k_t for _, k_t in st} for name, st in res.steps.items()}
    assert 0 in ks["ngram"] and len(ks["ngram"]) > 1
    assert len(ks["draft_model"] - {0}) > 1, ks  # k varied between speculative steps
    rows = [r for r, _ in res.steps["draft_model"]]
    chunk_starts = {4096, 6000 - 4096}  # 6000 rows decoded 4096 at a time
    assert any(r not in chunk_starts for r in rows)  # rows retired mid-generation...
    assert all(r in capture_sizes(4096) for r in rows if r not in chunk_starts)  # ...to capture sizes only
    biased = _audit(
        target,
        {"draft_model": DraftModelDrafter(draft)},
        6000,
        opts,
        prompts=AUDIT_PROMPTS[:1],
        rejection_fn=accept_all_rejection_sample,
    )
    assert not biased.passed


@pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="torch.compile on CPU needs a C++ compiler"
)
@pytest.mark.slow  # an audit through the compiled engine
def test_audit_reaches_the_compiled_engine():
    """With compile on, the audited draft_model arm's steps run the compiled callable, and pass."""
    from drafters.draft_model import DraftModelDrafter
    from workbench.audit import EngineOptions

    target, draft = _audit_models()
    target.enable_compile()  # what build_engine calls (idempotent: it keeps this callable)
    real, calls = target.__dict__["_compiled"], []
    target.__dict__["_compiled"] = lambda *a: calls.append(1) or real(*a)
    res = _audit(
        target,
        {"draft_model": DraftModelDrafter(draft)},
        1000,
        EngineOptions(adaptive=True, buckets=True, compile=True),
        prompts=AUDIT_PROMPTS[:1],
    )
    assert res.passed, [t for t in res.tests if not t.passed]
    assert calls and "_compiled" in draft.__dict__
