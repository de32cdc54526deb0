"""Where the audit samples: ``--context accepted`` puts an accepted, uncertain draft at completion position 1."""

from dataclasses import replace
from unittest import mock

import pytest
import torch
from typer.testing import CliRunner

from workbench.audit import ACCEPT_BAND, accepting_contexts, first_position_acceptance, run_audit
from workbench.rollout.counters import SpecCounters
from workbench.rollout.sampling import SamplingParams


@pytest.fixture(scope="module")
def quickstart():
    """The quickstart's tiny target, its task prompts and its draft_model drafter (tiny-draft)."""
    from workbench.audit.setup import audit_setup
    from workbench.specs.load import load_spec

    return audit_setup(load_spec("quickstart", []), ["draft_model"], 2, torch.device("cpu"))


def _sp(st) -> SamplingParams:
    return SamplingParams(1.0, 1.0, 0, 5, st.tokenizer.eos_token_id, stop_token_ids=st.stop_token_ids)


def test_first_position_acceptance_is_per_verification_with_a_draft():
    c = SpecCounters(k=3, num_drafts=8, num_draft_tokens=24, num_accepted_tokens=9)
    c.num_accepted_tokens_per_pos = [6, 2, 1]
    assert first_position_acceptance(c) == 6 / 8
    assert first_position_acceptance(SpecCounters(k=3)) is None  # nothing drafted: no rate, not 0


def test_accept_band_is_checked(quickstart):
    st = quickstart
    with pytest.raises(ValueError, match="accept band"):
        accepting_contexts(st.lm, st.drafters["draft_model"], st.prompt_ids[:1], _sp(st), 3, band=(0.9, 0.3))


def test_accepted_context_has_its_first_draft_accepted_inside_the_band(quickstart):
    """The context is the prompt plus the target's own tokens; re-measured at 2,000 fresh rows, the first
    verified draft (completion position 1) is accepted at a rate near the band, the target certain at
    position 0 and uncertain at 1 (so the audited law there has more than one token)."""
    from workbench.audit.engines import EngineOptions, build_engine

    st = quickstart
    sp, drafter = _sp(st), st.drafters["draft_model"]
    [(ctx, rate)] = accepting_contexts(st.lm, drafter, st.prompt_ids[:1], sp, 3, seed=0)
    assert rate is not None and ACCEPT_BAND[0] <= rate <= ACCEPT_BAND[1]
    assert ctx[: len(st.prompt_ids[0])] == st.prompt_ids[0] and len(ctx) > len(st.prompt_ids[0])
    out = build_engine(st.lm, drafter, 3, 2000, 2000, EngineOptions()).generate(
        [ctx] * 2000, replace(sp, max_new_tokens=2), torch.Generator().manual_seed(99)
    )
    again = first_position_acceptance(out.counters)
    assert ACCEPT_BAND[0] - 0.1 <= again <= ACCEPT_BAND[1] + 0.1, again  # the probe had 64 rows: its own error
    first = [t[0] for t in out.tokens]
    second = [t[1] for t in out.tokens if len(t) > 1]
    assert max(first.count(x) for x in set(first)) > 0.9 * len(first)
    assert max(second.count(x) for x in set(second)) < 0.97 * len(second)


def test_a_prompt_without_a_cut_in_the_band_comes_back_unchanged(quickstart):
    st = quickstart
    [(ctx, rate)] = accepting_contexts(
        st.lm, st.drafters["draft_model"], st.prompt_ids[:1], _sp(st), 3, band=(0.999, 1.0), scan=4
    )
    assert rate is None and ctx == st.prompt_ids[0]


def test_run_audit_samples_each_drafter_at_its_own_context(quickstart):
    """A mapping of contexts: each drafter's rows start from its own, and its exact law is computed there."""
    from workbench.audit import law

    st = quickstart
    sp, drafter = _sp(st), st.drafters["draft_model"]
    a, b = st.prompt_ids[0], st.prompt_ids[1]
    seen = []
    real = law.exact_joint2
    with mock.patch.object(law, "exact_joint2", lambda t, p, *args, **kw: seen.append(p) or real(t, p, *args, **kw)):
        res = run_audit(st.lm, {"one": drafter, "two": drafter}, {"one": [a], "two": [b]}, sp, k=3, n=200)
    assert seen == [a, b] and res.num_tests == 2 * 1 * 6
    assert set(res.first_acceptance) == {"one", "two"} and all(v[1] > 0 for v in res.first_acceptance.values())


def test_run_audit_refuses_contexts_that_do_not_match_its_drafters(quickstart):
    st = quickstart
    sp, drafter, a = _sp(st), quickstart.drafters["draft_model"], st.prompt_ids[0]
    with pytest.raises(ValueError, match="one list per drafter name"):
        run_audit(st.lm, {"one": drafter, "two": drafter}, {"one": [a]}, sp, k=3, n=50)
    with pytest.raises(ValueError, match="all of one length"):
        run_audit(st.lm, {"one": drafter, "two": drafter}, {"one": [a], "two": [a, a]}, sp, k=3, n=50)


def test_cli_context_accepted_names_each_drafters_context_and_bad_values_exit_2(monkeypatch):
    from workbench import cli
    from workbench.cli import common

    monkeypatch.setattr(common.console, "width", 250)
    r = CliRunner().invoke(
        cli.app, ["audit", "quickstart", "--drafters", "draft_model", "--context", "accepted", "--samples", "300"]
    )
    assert r.exit_code == 0, r.output
    assert "draft_model contexts (first draft accepted at 0.3-0.9" in r.output and "(probe 0." in r.output
    assert "first-position acceptance" in r.output and "audit passed" in r.output
    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "--context", "sure"])
    assert r.exit_code == 2 and "--context: 'sure'; allowed values: uncertain, accepted" in r.output
    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "rollout.backend=vllm", "--context", "accepted"])
    assert r.exit_code == 2 and "drop rollout.backend=vllm" in r.output
    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "--identity", "--context", "accepted"])
    assert r.exit_code == 2 and "--identity decodes whole task prompts: drop one" in r.output
    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "--identity", "--context", "sure"])
    assert r.exit_code == 2 and "allowed values: uncertain, accepted" in r.output
