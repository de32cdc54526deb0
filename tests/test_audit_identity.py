"""`wb audit --identity`: plain vs speculative decoding with the same row seeds, compared token for token.

The comparison and the tie rule on hand-made inputs; the CLI on the tiny preset passing under keyed
sampling and failing under the rejection sampler (the check's teeth); a planted wrong keyed verifier
found and scored (its differences are no float ties).
"""

import pytest
import torch
from typer.testing import CliRunner

from workbench.audit.identity import (
    Divergence,
    IdentityReport,
    classify,
    compare,
    grpo_groups,
    run_identity,
    support_edge,
    tie_tolerance,
    with_row_seeds,
)
from workbench.rollout import engine as engine_mod
from workbench.rollout.keyed import BLOCK, block_uniform, keyed_sample, keyed_uniform
from workbench.rollout.sampling import SamplingParams, probs_from_logits


def test_compare_counts_rows_tokens_and_first_divergences():
    plain = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [1]]
    spec = [[1, 2, 3], [4, 0, 6, 0], [8, 9, 10], [1]]
    c = compare(plain, spec)
    assert (c.rows, c.tokens, c.differing_rows, c.differing_tokens) == (4, 3 + 4 + 3 + 1, 2, 2 + 1)
    assert c.first == ((1, 1), (2, 2))  # row 2: equal up to plain's end, then one arm goes on
    with pytest.raises(ValueError, match="3 plain rows against 2"):
        compare(plain[:3], spec[:2])


def gumbel(seed, pos, V):
    return -(-keyed_uniform(torch.tensor([seed]), torch.tensor([[pos]]), V)[0, 0].log()).log()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_two_candidates_with_equal_keyed_scores_are_a_tie_and_a_real_gap_is_not(temperature):
    """Logits made so that z_a/T + G_a = z_b/T + G_b: a tie; move b by 100 tolerances: not one."""
    V, seed, pos, a, b = 6, 12345, 7, 1, 4
    sp = SamplingParams(temperature=temperature)
    g = gumbel(seed, pos, V)
    z = torch.full((V,), -30.0, dtype=torch.float64)
    z[a] = 3.0
    z[b] = temperature * (z[a] / temperature + g[a] - g[b])
    gap, tol, tie = classify(z.float(), sp, seed, pos, a, b, torch.float32)
    assert tie == "score" and abs(gap) <= tol
    assert tol == pytest.approx(2 * 64 * torch.finfo(torch.float32).eps * float(z.abs().max()) / temperature)
    z[b] += 100 * tol * temperature
    gap, tol, tie = classify(z.float(), sp, seed, pos, a, b, torch.float32)
    assert tie == "" and gap < -tol
    assert (
        int(keyed_sample(probs_from_logits(z.float(), sp)[None, None], torch.tensor([seed]), torch.tensor([[pos]])))
        == b
    )


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_candidates_in_two_blocks_tie_on_their_block_scores(temperature):
    """a in block 0, b in block 1, every other token negligible: logits made so that the two blocks' keyed
    scores S = log P + G are equal give a tie; 100 tolerances apart, not one (and the sample follows)."""
    V, seed, pos, a, b = 2 * BLOCK, 99, 3, 5, BLOCK + 17
    sp = SamplingParams(temperature=temperature)
    gb = -(-block_uniform(torch.tensor([seed]), torch.tensor([[pos]]), 2)[0, 0].log()).log()  # (2,)
    z = torch.full((V,), -60.0, dtype=torch.float64)
    z[a] = 4.0
    z[b] = temperature * (z[a] / temperature + gb[0] - gb[1])
    gap, tol, tie = classify(z.float(), sp, seed, pos, a, b, torch.float32)
    assert tie == "score" and abs(gap) <= tol
    z[b] += 100 * tol * temperature
    gap, tol, tie = classify(z.float(), sp, seed, pos, a, b, torch.float32)
    assert tie == "" and gap < -tol
    p = probs_from_logits(z.float(), sp)[None, None]
    assert int(keyed_sample(p, torch.tensor([seed]), torch.tensor([[pos]]))) == b


def test_a_token_on_the_top_p_edge_is_a_tie_when_the_other_is_best_of_the_rest():
    """p = (0.5, 0.45, 0.05), top_p 0.95: token 2's mass before it is exactly top_p, so a forward's
    rounding keeps or drops it; a difference between it and the best of the rest is a tie."""
    sp = SamplingParams(temperature=1.0, top_p=0.95)
    z = torch.tensor([0.5, 0.45, 0.05]).log()
    tol = tie_tolerance(z, 1.0, torch.float32)
    assert support_edge(z.double(), sp, tol).tolist() == [False, False, True]
    for seed in range(200):  # a seed where token 2 would win if kept
        g = gumbel(seed, 0, 3)
        s = z.double() + g
        if int(s.argmax()) == 2:
            break
    best = int(s[:2].argmax())
    assert classify(z, sp, seed, 0, best, 2, torch.float32)[2] == "edge"
    assert classify(z, sp, seed, 0, 1 - best, 2, torch.float32)[2] == ""  # not the best of the rest
    assert classify(z, sp, seed, 0, 0, 1, torch.float32)[2] == ""  # neither on the edge, scores apart


def test_greedy_ties_are_equal_logits():
    sp = SamplingParams(temperature=0.0)
    assert classify(torch.tensor([2.0, 2.0, -1.0]), sp, 0, 0, 0, 1, torch.float32)[2] == "score"
    assert classify(torch.tensor([2.0, 1.9, -1.0]), sp, 0, 0, 0, 1, torch.float32)[2] == ""


def test_a_report_passes_only_when_every_differing_row_parts_at_a_tie():
    c = compare([[1, 2], [3, 4]], [[1, 5], [3, 6]])
    tie, real = Divergence(0, 1, 2, 5, 1e-6, 1e-5, "score"), Divergence(1, 1, 4, 6, 0.3, 1e-5, "")
    assert IdentityReport("x", 3, "keyed", c, [tie, tie], 0.5).passed
    assert not IdentityReport("x", 3, "keyed", c, [tie, real], 0.5).passed
    assert "not a tie" in real.describe() and "a float tie" in tie.describe()


@pytest.fixture(scope="module")
def tiny():
    from workbench.audit.setup import audit_setup
    from workbench.specs.load import load_spec

    return audit_setup(load_spec("quickstart", []), ["ngram"], 4, torch.device("cpu"))


def accept_every_draft(target_probs, draft_tokens, num_draft, seed, pos0):
    """A wrong keyed verifier: every real draft accepted, then the keyed sample."""
    B, k1, _ = target_probs.shape
    keyed = keyed_sample(target_probs, seed, pos0[:, None] + torch.arange(k1)[None, :])
    rows = torch.arange(B)
    tokens = torch.cat([draft_tokens, keyed[:, -1:]], 1)
    tokens[rows, num_draft] = keyed[rows, num_draft]
    return num_draft.clone(), tokens


def test_a_wrong_keyed_verifier_is_found_and_its_differences_are_no_ties(tiny, monkeypatch):
    prompts, groups = grpo_groups(tiny.prompt_ids, 4)
    sp = SamplingParams(temperature=1.0, max_new_tokens=48, eos_token_id=tiny.tokenizer.eos_token_id, sampler="keyed")
    sp = with_row_seeds(sp, len(prompts), 0, 4)
    ok = run_identity(tiny.lm, tiny.drafters["ngram"], prompts, sp, 3, 8, group_ids=groups)
    assert ok.passed and ok.comparison.differing_rows == 0 and ok.acceptance > 0
    monkeypatch.setattr(engine_mod, "keyed_verify", accept_every_draft)
    bad = run_identity(tiny.lm, tiny.drafters["ngram"], prompts, sp, 3, 8, group_ids=groups)
    assert not bad.passed and bad.comparison.differing_rows > len(prompts) // 2 and bad.ties == 0
    assert all(d.gap is not None and abs(d.gap) > d.tol for d in bad.divergences)  # scored, far from ties


def _identity_runs(uri):
    """{drafter: (metrics, status)} of the audit runs in an MLflow store, oldest first."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, "tags.`workbench.audit` = 'identity'", order_by=["start_time"])
    return [(r.data.metrics, r.info.status, r.data.params) for r in runs]


def test_cli_identity_on_tiny_passes_keyed_and_fails_with_the_rejection_sampler(monkeypatch, tmp_path):
    from workbench import cli
    from workbench.cli import common

    monkeypatch.setattr(common.console, "width", 250)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        "audit",
        "quickstart",
        "--identity",
        "--prompts",
        "6",
        "rollout.max_batch_size=16",
        f"tracking.tracking_uri={uri}",
    ]
    r = CliRunner().invoke(cli.app, args)
    assert r.exit_code == 0, r.output
    assert "sampler keyed" in r.output and "6 prompts x 8 samples = 48 rows" in r.output
    row = next(line for line in r.output.splitlines() if line.startswith("│ draft_model"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1:2] == ["3"] and cells[4:7] == ["0", "0", "0"] and cells[-1] == "identical", row
    assert int(cells[3]) > 48 * 13 and float(cells[7]) > 0.3  # whole completions; drafts accepted
    r = CliRunner().invoke(cli.app, [*args, "--drafters", "ngram", "rollout.sampler=rejection"])
    assert r.exit_code == 1, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("│ ngram"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert int(cells[4]) > 24 and cells[6] == "0" and cells[-1] == "FAIL", row
    assert "audit FAILED" in r.output and "not a tie" in r.output
    (keyed, status, params), (rejection, status_r, params_r) = _identity_runs(uri)  # what MLflow holds
    assert status == status_r == "FINISHED" and (params["sampler"], params_r["sampler"]) == ("keyed", "rejection")
    assert keyed["identity/draft_model/differing_tokens"] == 0 and keyed["identity/draft_model/passed"] == 1
    assert keyed["identity/draft_model/rows"] == 48 and keyed["identity/draft_model/acceptance"] > 0.3
    assert rejection["identity/ngram/differing_rows"] > 24 and rejection["identity/ngram/passed"] == 0


def test_cli_identity_refuses_what_it_cannot_check():
    from workbench import cli

    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "--identity", "drafter.kind=none"])
    assert r.exit_code == 2 and "drafter.kind is none" in r.output
    r = CliRunner().invoke(cli.app, ["audit", "quickstart", "--identity", "--biased"])
    assert r.exit_code == 2 and "--biased" in r.output
    r = CliRunner().invoke(
        cli.app, ["audit", "quickstart", "--identity", "tracking.tracking_uri=sqlite:////proc/no/m.db"]
    )
    assert r.exit_code == 2 and "MLflow store sqlite:////proc/no/m.db cannot be used" in r.output
