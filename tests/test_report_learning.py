"""`wb report`'s "Does GRPO learn?" table: held-out accuracy before/after pooled over seeds, the rise
with Newcombe's interval; and the proportion intervals it rests on."""

import pytest
from mlflow.entities import Metric

from workbench.report import make_report
from workbench.stats import proportion_diff_ci, wilson

from test_report import fake_sweep


def test_wilson_matches_scipy_and_refuses_bad_counts():
    from scipy.stats import binomtest

    ci = binomtest(30, 100).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(30, 100) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert wilson(0, 10)[0] == pytest.approx(0.0) and wilson(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson(11, 10)
    with pytest.raises(ValueError, match="n >= 1"):
        wilson(0, 0)


def test_newcombe_hybrid_score_interval_published_example():
    # Newcombe (1998), Stat. Med. 17:873, table II, example (a): 56/70 vs 48/80, method 10: 0.0524 to 0.3339
    d, lo, hi = proportion_diff_ci(48, 80, 56, 70)
    assert d == pytest.approx(0.2) and lo == pytest.approx(0.0524, abs=1e-4) and hi == pytest.approx(0.3339, abs=1e-4)
    d, lo, hi = proportion_diff_ci(56, 70, 48, 80)  # the other direction: the same interval, negated
    assert (d, lo, hi) == pytest.approx((-0.2, -0.3339, -0.0524), abs=1e-4)


def _with_evals(client, name, evals, last_number=False):
    """fake_sweep's runs, then each run's held-out eval at step 0 and 4 (``evals``: kind -> [(first, last)] per
    seed)."""
    points = [
        {
            "kind": kind,
            "k": None if kind == "none" else 3,
            "seed": s,
            "gen_s": 1.0,
            "reward": 0.3,
            "params": {"task.num_eval": 256},
        }
        for kind, per_seed in evals.items()
        for s in range(len(per_seed))
    ]
    fake_sweep(client, name, points)
    exp = client.get_experiment_by_name(f"wb-{name}")
    for r in client.search_runs([exp.experiment_id]):
        kind, seed = r.data.params.get("drafter.kind"), r.data.params.get("seed")
        if kind is None:
            continue  # the parent
        a0, a1 = evals[kind][int(seed)]
        client.log_batch(r.info.run_id, metrics=[Metric("eval/accuracy", a0, 0, 0), Metric("eval/accuracy", a1, 0, 4)])
        if last_number:  # the anchor-free check moved less: a format-only rise
            client.log_batch(
                r.info.run_id, metrics=[Metric("eval/last_number", a0, 0, 0), Metric("eval/last_number", a0, 0, 4)]
            )


def test_rise_pooled_over_seeds_shown_only_when_its_interval_excludes_zero(store):
    # none: 3 seeds each +0.09 (256 prompts): pooled 768 per side, the rise shown; draft_model: +0.02, not shown
    _with_evals(
        store,
        "lrn",
        {
            "none": [(0.383, 0.48), (0.398, 0.484), (0.375, 0.465)],
            "draft_model": [(0.383, 0.41), (0.398, 0.41), (0.375, 0.395)],
        },
    )
    _, rep = make_report("lrn", "out")
    md = rep.markdown.read_text()
    sec = md.split("## Does GRPO learn? Held-out accuracy before and after")[1].split("\n## ")[0]
    none = next(line for line in sec.splitlines() if line.startswith("| none | greedy |"))
    dm = next(line for line in sec.splitlines() if line.startswith("| draft_model | greedy |"))
    k0 = round(0.383 * 256) + round(0.398 * 256) + round(0.375 * 256)
    k1 = round(0.48 * 256) + round(0.484 * 256) + round(0.465 * 256)
    d, lo, hi = proportion_diff_ci(k0, 768, k1, 768)
    assert f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" in none and none.endswith("| yes |") and "| 3 | 0→4 |" in none
    assert dm.endswith("| not shown |")
    assert "| sampled |" not in sec  # no eval_sampled logged: no row
    assert "last number" not in sec.split("\n\n")[0]  # nor the anchor-free check


def test_anchor_free_rows_show_a_format_only_rise(store):
    _with_evals(store, "lrn2", {"none": [(0.383, 0.48), (0.398, 0.484), (0.375, 0.465)]}, last_number=True)
    _, rep = make_report("lrn2", "out")
    sec = rep.markdown.read_text().split("## Does GRPO learn? Held-out accuracy before and after")[1].split("\n## ")[0]
    assert next(line for line in sec.splitlines() if line.startswith("| none | greedy |")).endswith("| yes |")
    assert next(line for line in sec.splitlines() if line.startswith("| none | greedy, last number |")).endswith(
        "| not shown |"
    )


def test_no_evals_no_section(store):
    fake_sweep(store, "noeval", [{"kind": "none", "seed": 0, "gen_s": 1.0, "reward": 0.3}])
    _, rep = make_report("noeval", "out")
    assert "Does GRPO learn?" not in rep.markdown.read_text()


def test_an_experiment_name_reports_its_runs_at_several_seeds(store):
    """`wb run SPEC seed=N` runs share an MLflow experiment and no sweep: the experiment's name reports
    them together (FINISHED ones pooled; a killed one listed, not pooled)."""
    from test_runs import log_run

    exp = store.create_experiment("seeds-exp")
    for seed, status in ((0, "FINISHED"), (1, "FINISHED"), (2, "KILLED")):
        rid = log_run(
            store,
            exp,
            f"learn-seed{seed}",
            {"drafter.kind": "ngram", "drafter.k": 3, "seed": seed, "task.num_eval": 64},
            {"reward/mean": [0.1, 0.2, 0.3]},
            status=status,
        )
        store.log_batch(rid, metrics=[Metric("eval/accuracy", 4 / 64, 0, 0), Metric("eval/accuracy", 13 / 64, 0, 24)])
    t, rep = make_report("seeds-exp", "out")
    md = rep.markdown.read_text()
    assert t.kind == "experiment" and len(t.runs) == 3
    assert "3 top-level runs (2 finished, 1 killed)" in md
    row = next(line for line in md.splitlines() if line.startswith("| ngram | greedy |"))
    assert "| 2 | 0→24 |" in row and "0.062 [" in row and "0.203 [" in row
