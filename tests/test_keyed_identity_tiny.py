"""Identity on the tiny preset: plain and speculative decoding with the same row seeds are token for
token equal, for every drafter kind, k in {1, 3, 7}, at T 0.7 and at T 1 / top-p 0.95.

As a GRPO step decodes: each prompt several times (groups contiguous, prefix sharing), more rows than
the batch holds (continuous batching), whole completions (eos or 96 tokens). The comparison and its
tie rule are ``wb audit --identity``'s (workbench/audit/identity.py): a difference passes only where a
row's first differing token is a float tie, counted. Drafters are built as a run builds them; mtp,
eagle3 and dflash from a short init on the target's own completions (seconds to tens of seconds of
training each on the 2-core CPU), so their drafts are accepted and the accept path runs.

Unmarked: the kinds that need no training (ngram, suffix, draft_model with tiny-draft), every k and
both settings, a small batch. Slow: the trained kinds, and every kind at 4x the rows (k = 3).
"""

from dataclasses import replace

import pytest
import torch

from drafters import DRAFTERS, drafter_class
from workbench.audit.identity import grpo_groups, plain_completions, run_identity, with_row_seeds
from workbench.rollout.sampling import SamplingParams

SETTINGS = {"T0.7": dict(temperature=0.7), "T1-top_p0.95": dict(temperature=1.0, top_p=0.95)}
SIZES = {"small": (6, 4, 12), "big": (24, 8, 64)}  # prompts, samples per prompt, rows decoded together
INIT = ["drafter.init.num_prompts=32", "drafter.init.steps=20"]  # the trained kinds' short init


def trained(kind: str) -> bool:
    from workbench.specs.load import load_spec

    return drafter_class(kind).initialised_by_default(load_spec("quickstart", [f"drafter.kind={kind}"]).drafter)


CASES = [
    pytest.param(kind, k, setting, size, marks=[pytest.mark.slow] if size == "big" or trained(kind) else [])
    for size in SIZES
    for setting in SETTINGS
    for k in (1, 3, 7)
    for kind in DRAFTERS
    if size == "small" or k == 3  # 4x the rows at one k: CI's budget (every k runs at the small size)
]


class Tiny:
    """The tiny target and prompts, drafters built on first use against that one target, plain arms cached."""

    def __init__(self):
        from workbench.audit.setup import audit_setup
        from workbench.specs.load import load_spec

        self.spec = load_spec("quickstart", INIT)
        self.setup = audit_setup(self.spec, [], max(n for n, _, _ in SIZES.values()), torch.device("cpu"))
        self.drafters: dict = {}
        self.plain: dict = {}

    def drafter(self, kind):
        from workbench.drafter_init import drafter_as_run
        from workbench.models import resolve_model
        from workbench.specs.resolve import drafter_init_config

        if kind not in self.drafters:
            st = self.setup
            ks = self.spec.model_copy(update={"drafter": self.spec.drafter.model_copy(update={"kind": kind})})
            path = resolve_model(self.spec.model.target, what="model.target")
            try:
                self.drafters[kind] = drafter_as_run(drafter_init_config(ks), st.lm, st.tokenizer, path, st.device)
            except (ValueError, NotImplementedError, ImportError, OSError, TypeError) as e:
                self.drafters[kind] = f"{kind} cannot be built on tiny: {str(e).splitlines()[0]}"
        return self.drafters[kind]

    def arms(self, setting, size):
        """The rows, group ids, keyed sampling with row seeds, batch and the plain arm's completions."""
        n, G, batch = SIZES[size]
        st = self.setup
        prompts, groups = grpo_groups(st.prompt_ids[:n], G)
        sp = SamplingParams(max_new_tokens=96, eos_token_id=st.tokenizer.eos_token_id, stop_token_ids=st.stop_token_ids)
        sp = with_row_seeds(replace(sp, **SETTINGS[setting], sampler="keyed"), len(prompts), 3, G)
        if (setting, size) not in self.plain:
            self.plain[setting, size] = plain_completions(st.lm, prompts, sp, batch, 0, groups)
        return prompts, groups, sp, batch, self.plain[setting, size]


@pytest.fixture(scope="module")
def tiny():
    return Tiny()


@pytest.mark.parametrize("kind,k,setting,size", CASES)
def test_speculative_equals_plain_with_the_same_seeds_on_tiny(tiny, kind, k, setting, size):
    drafter = tiny.drafter(kind)
    if isinstance(drafter, str):
        pytest.skip(drafter)
    prompts, groups, sp, batch, plain = tiny.arms(setting, size)
    assert len(prompts) > batch  # continuous batching: rows join as others finish
    r = run_identity(tiny.setup.lm, drafter, prompts, sp, k, batch, name=kind, group_ids=groups, plain=plain)
    assert r.passed, r.summary() + "\n" + "\n".join(d.describe() for d in r.divergences[:5])
    assert r.comparison.differing_rows == r.ties  # any tie met is counted on the report
    assert r.acceptance > 0  # drafts were accepted: the accept path ran
    assert r.comparison.tokens > len(prompts) * 13  # whole completions, past the restated expression
    assert len({tuple(t) for t in plain}) > SIZES[size][0]  # a prompt's samples differ


@pytest.mark.parametrize("kind", ["draft_model", pytest.param("eagle3", marks=pytest.mark.slow)])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_coupled_drafts_keep_the_identity(tiny, kind, setting):
    """``rollout.keyed_draft=coupled``: drafts drawn with the target's keyed noise change which drafts are
    accepted, never what is emitted."""
    drafter = tiny.drafter(kind)
    if isinstance(drafter, str):
        pytest.skip(drafter)
    prompts, groups, sp, batch, plain = tiny.arms(setting, "small")
    sp = replace(sp, keyed_draft="coupled")
    r = run_identity(tiny.setup.lm, drafter, prompts, sp, 3, batch, name=kind, group_ids=groups, plain=plain)
    assert r.passed and r.comparison.differing_rows == r.ties, r.summary()
    assert r.acceptance > 0
