"""`wb audit`: exact engines pass, a biased verifier fails, the CLI exits accordingly."""

from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from drafters.draft_model import DraftModelDrafter
from drafters.ngram import NgramDrafter
from workbench.audit import (
    accept_all_rejection_sample,
    detectable_shift,
    expected_counts,
    goodness_of_fit,
    plan,
    required_samples,
    run_audit,
)
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.rollout.workbench_backend import WorkbenchBackend

from conftest import random_llama

V = 12


@pytest.fixture(scope="module")
def models():
    hf = random_llama(vocab=V, hidden=32, layers=1, seed=20, lm_head_std=0.6)
    target = LeanLM.from_hf(hf)
    draft = LeanLM.from_hf(hf)  # a close but different draft: often, not always, accepted
    draft.lm_head.weight.add_(0.5 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    return target, draft


PROMPTS = [[1, 3, 4, 3, 4], [1, 5, 6]]
SP = SamplingParams(temperature=1.0, max_new_tokens=3, eos_token_id=2)


def test_power_calculation():
    # one-sample test against the exact law: z_{1-a/2} + z_{0.9} for a = 1e-4: 3.891 + 1.2816; n = z^2 * 0.25 / 0.01^2
    assert required_samples(1e-4) == pytest.approx(26.75 * 2500, rel=0.01)
    assert detectable_shift(required_samples(1e-4), 1e-4) == pytest.approx(0.01, rel=1e-3)
    m, a, n = plan(2, 1, 4, 1e-3)
    assert m == 10 and a == pytest.approx(1e-4)


def test_goodness_of_fit_pools_and_detects():
    ok = goodness_of_fit(torch.tensor([505.0, 495, 3, 0]), torch.tensor([500.0, 500, 2, 1]))
    assert ok[2] > 0.1 and ok[1] == 1  # the small cells (expected 3) merge into the smallest kept cell
    pooled = goodness_of_fit(torch.tensor([500.0, 490, 4, 2, 4]), torch.tensor([500.0, 490, 3, 3, 4]))
    assert pooled[1] == 2  # two big cells + pooled "other" (expected 10)
    assert goodness_of_fit(torch.tensor([5600.0, 4400]), torch.tensor([5000.0, 5000]))[2] < 1e-6
    assert goodness_of_fit(torch.tensor([10.0, 1]), torch.tensor([11.0, 0]))[2] == 0.0  # an impossible token
    assert goodness_of_fit(torch.tensor([10.0]), torch.tensor([10.0]))[2] == 1.0


def test_goodness_of_fit_one_cell_left_tests_the_mass_outside_it():
    # the exact law puts ~all mass on one token: Pearson has one cell; the rows that fell elsewhere
    # are tested against the mass outside it (binomial). 2600 of 3000 rows on a token of p = 1e-6:
    # the case vLLM-CPU's sampled speculation produced, which the pooled test used to pass
    e = torch.tensor([3000 * (1 - 2e-6), 3000 * 1e-6, 3000 * 1e-6], dtype=torch.float64)
    stat, df, p = goodness_of_fit(torch.tensor([400.0, 2600, 0]), e)
    assert p < 1e-12 and df == 1 and stat == 2600
    assert goodness_of_fit(torch.tensor([3000.0, 0, 0]), e)[2] > 0.5  # exact rows: nothing outside the cell
    # outside mass 1 %: 30 rows expected; 31 is fine, 80 is not
    e2 = torch.tensor([2970.0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    assert goodness_of_fit(torch.tensor([2969.0] + [2.0] * 15 + [0.0] * 0), e2)[2] > 0.05
    assert goodness_of_fit(torch.tensor([2920.0, 80] + [0.0] * 14), e2)[2] < 1e-6


def test_expected_counts_equal_the_row_by_row_sum(models):
    """Distinct rows weighted by their counts give the same E_t(v) as summing p over every row."""
    target, _ = models
    prompt, T = PROMPTS[0], 4
    g = torch.Generator().manual_seed(3)
    toks = torch.randint(3, 6, (300, T), generator=g)  # few values: many repeated rows
    lens = torch.randint(1, T + 1, (300,), generator=g)
    toks[torch.arange(T)[None, :] >= lens[:, None]] = -1  # -1 past each row's end
    E = expected_counts(target, prompt, toks, lens, SP)
    ref = torch.zeros(T, V, dtype=torch.float64)
    for r in range(300):
        for t in range(int(lens[r])):
            ctx = torch.tensor([prompt + toks[r, :t].tolist()])
            logits, _ = target(ctx, torch.zeros(1, dtype=torch.long), target.new_cache(1, ctx.shape[1]))
            ref[t] += torch.softmax(logits[0, -1].double() / SP.temperature, -1)
    assert torch.allclose(E, ref, atol=1e-6)


def test_exact_engine_p_values_are_not_anti_conservative(models):
    """Over many seeds an exact engine's p-values are (at least) uniform: few small ones."""
    target, draft = models
    ps = []
    for seed in range(12):
        res = run_audit(target, {"draft_model": DraftModelDrafter(draft)}, PROMPTS[:1], SP, k=2, n=2000, seed=seed)
        ps += [t.pvalue for t in res.tests if t.pvalue is not None]
    assert sum(p < 0.05 for p in ps) <= 0.05 * len(ps) + 3  # binomial slack: P(false fail) < 1e-3


def test_exact_engine_passes(models):
    target, draft = models
    drafters = {"ngram": NgramDrafter(1, 2), "draft_model": DraftModelDrafter(draft)}
    res = run_audit(target, drafters, PROMPTS, SP, k=2, n=6000, alpha=1e-3)
    assert res.passed, [t for t in res.tests if not t.passed]
    assert res.num_tests == 2 * 2 * 4 and res.acceptance["draft_model"] > 0.1
    assert {t.test for t in res.tests} >= {"pos 0", "pos 2", "joint 0..1", "greedy"}


def test_biased_sampler_fails(models):
    target, draft = models
    res = run_audit(
        target,
        {"draft_model": DraftModelDrafter(draft)},
        PROMPTS[:1],
        SP,
        k=2,
        n=6000,
        rejection_fn=accept_all_rejection_sample,
    )
    assert not res.passed
    failed = {t.test for t in res.tests if not t.passed}
    assert "pos 1" in failed and "greedy" in failed


def test_a_second_stop_id_ends_rows_in_the_exact_law_too(models):
    """A stop id besides eos (a chat template's end-of-turn, a generation config's eos list) ends a
    row in the engines as eos does, so the audit's exact law must stop there too: an exact engine
    passes. The stop id is the target's most likely first token here, so thousands of rows end at
    it; a joint law that continued past it expected pairs (stop, x1) that no row can show."""
    target, draft = models
    prompt = PROMPTS[1]
    # (V,) p(x0)
    p0 = expected_counts(target, prompt, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long), SP)[0]
    p0[SP.eos_token_id] = 0.0
    stop = int(p0.argmax())
    assert p0[stop] > 0.2
    sp = replace(SP, stop_token_ids=(stop,))
    rows = (
        WorkbenchBackend(target, DraftModelDrafter(draft), k=2)
        .generate([prompt] * 400, sp, torch.Generator().manual_seed(1))
        .tokens
    )
    assert sum(r == [stop] for r in rows) > 0.2 * len(rows)  # the engine ends rows at the second stop id
    res = run_audit(target, {"draft_model": DraftModelDrafter(draft)}, [prompt], sp, k=2, n=6000, alpha=1e-3)
    assert res.passed, [t for t in res.tests if not t.passed]
    assert {t.test for t in res.tests} >= {"pos 1", "joint 0..1", "greedy"}


@pytest.mark.slow  # an audit of every drafter kind through the CLI
def test_cli_micro(monkeypatch):
    """`wb audit` end to end on the micro presets, on any machine (the presets are built on first use
    into the test session's cache, or taken from the shipped ones), with adaptive k and retire buckets.

    Power: 4000 rows per drafter (was 300, which could only see a ~15 % shift): 6 drafters x 4
    tests at a family-wise 1e-3 detect a 4.3 % shift of one token's probability near 0.5 with
    power 0.9 (the CLI prints it); the audit's sampling is ~2 s of the test on one core, the rest
    is loading and building the drafters. The biased sampler below is caught at 2000 rows (its
    shift is tens of percent)."""
    from workbench import cli
    from workbench.cli import common
    from workbench.models import resolve_model

    resolve_model("micro"), resolve_model("micro-draft")
    monkeypatch.setattr(common.console, "width", 250)  # lines read below unwrapped (COLUMNS is read once, at import)
    r = CliRunner().invoke(
        cli.app,
        ["audit", "micro", "--samples", "4000", "--max-new-tokens", "3", "--prompts", "1", "--adaptive", "--buckets"],
    )
    assert r.exit_code == 0, r.output
    assert "detectable shift at n=4000: 4.3 %" in r.output and "engine: adaptive+buckets" in r.output
    assert "engine paths: " in r.output and "k_t [0, 1]" in r.output  # adaptive k reached (plain steps and drafts)
    assert "draft_model" in r.output and "ngram" in r.output and "dflash" in r.output and "pass" in r.output
    assert "skipped" not in r.output, r.output  # every drafter kind audited, none skipped for a missing preset
    r = CliRunner().invoke(
        cli.app, ["audit", "micro", "--samples", "2000", "--max-new-tokens", "3", "--prompts", "1", "--biased"]
    )
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.output


def test_informative_contexts_put_the_uncertain_token_where_a_draft_is_verified():
    """The first completion token comes from the prefill (never drafted), so the audit's contexts end one
    token before the target's first uncertain position: certain next token, uncertain one after it."""
    from transformers import AutoModelForCausalLM

    from workbench.audit import informative_prompts
    from workbench.audit.setup import audit_setup
    from workbench.models import resolve_model
    from workbench.specs.load import load_spec

    st = audit_setup(load_spec("quickstart", []), [], 3, torch.device("cpu"))
    ctxs = informative_prompts(st.lm, st.prompt_ids, SamplingParams(1.0, 1.0, 0, 5, st.tokenizer.eos_token_id), seed=0)
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("tiny", what="model.target"))
    for prompt, ctx in zip(st.prompt_ids, ctxs):
        assert ctx[: len(prompt)] == prompt and len(ctx) > len(prompt)
        with torch.no_grad():
            p0 = hf(torch.tensor([ctx])).logits[0, -1].softmax(-1)  # completion position 0: the prefill's token
            p1 = hf(torch.tensor([ctx + [int(p0.argmax())]])).logits[0, -1].softmax(-1)  # position 1: first verified
        assert p0.max() > 0.9 and p1.max() < 0.97, (float(p0.max()), float(p1.max()))


def test_fit_test_names_the_test_it_used():
    from workbench.audit.law import fit_detail, fit_test

    assert fit_test(torch.tensor([505.0, 495]), torch.tensor([500.0, 500])).test == "chi2"
    e = torch.tensor([3000 * (1 - 2e-6), 3000 * 1e-6, 3000 * 1e-6], dtype=torch.float64)
    assert fit_test(torch.tensor([400.0, 2600, 0]), e).test == "binomial"
    assert fit_test(torch.tensor([10.0, 1]), torch.tensor([11.0, 0])).test == "impossible"
    small = fit_test(torch.tensor([2.0, 3, 1, 0]), torch.ones(4) * 1.5)  # 6 rows: no cell expects 5
    assert small.test == "none" and small.pvalue == 1.0
    what, low = fit_detail(small, 6, 1e-3)
    assert low and "chi2" not in what and "no test possible" in what and "low power" in what
    what, low = fit_detail(fit_test(torch.tensor([5050.0, 4950]), torch.tensor([5000.0, 5000])), 10_000, 1e-3)
    assert not low and what.startswith("chi2=") and "low power" not in what


def test_a_small_audit_says_its_tests_have_no_power(models):
    """At a few rows the joint test pools its cells to one: the row says which test ran (not "chi2 … pass")
    and that it has no power; the summary's result is "pass (low power)"."""
    from workbench.audit import summary_rows

    target, draft = models
    res = run_audit(target, {"draft_model": DraftModelDrafter(draft)}, PROMPTS[:1], SP, k=2, n=12)
    [joint] = [t for t in res.tests if t.test == "joint 0..1"]
    assert joint.low_power and "low power" in joint.detail and not joint.detail.startswith("chi2")
    assert ("draft_model", "joint 0..1") in {(d, n) for d, n, _, ok, _ in summary_rows(res) if ok == "pass (low power)"}
