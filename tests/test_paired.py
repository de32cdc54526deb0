"""Paired measurement inside the GRPO loop (issue #6): the shadow autoregressive generation is
timed and counted but leaves training bit-identical, and its ratios reach MLflow with their CI."""

import pytest
import torch

from workbench.grpo.trainer import GRPOTrainer, paired_metrics
from workbench.rollout.engine import SpecCounters
from workbench.run_build import build_parts
from workbench.specs import load_spec


def _train(paired: bool, kind: str = "draft_model", steps: int = 3):
    spec = load_spec(
        "micro",
        [
            f"drafter.kind={kind}",
            f"measure.paired={str(paired).lower()}",
            "grpo.eval_every=0",
            "drafter.init.data=none",
        ],
    )
    tr = GRPOTrainer(build_parts(spec, progress=False))
    hist = [tr.step(s)[0] for s in range(1, steps + 1)]
    return tr, hist


@pytest.mark.parametrize("kind", ["draft_model", "ngram"])
def test_paired_generation_leaves_training_bit_identical(kind):
    off, h_off = _train(False, kind)
    on, h_on = _train(True, kind)
    for a, b in zip(h_off, h_on):
        for key in ("reward/mean", "loss/policy", "grad_norm", "gen/num_tokens", "spec/num_accepted_tokens"):
            assert a[key] == b[key], key  # exactly: same RNG draws, same rollouts, same update
        assert (
            "speedup/gen_per_step" not in a and b["speedup/gen_per_step"] > 0 and b["timing_s/gen_autoregressive"] > 0
        )
    for p, q in zip(off.policy.parameters(), on.policy.parameters()):
        assert torch.equal(p, q)
    # the paired arm alternates: autoregressive first on even steps only
    assert [m["gen_autoregressive/first"] for m in h_on] == [0.0, 1.0, 0.0]
    # and it really decoded the step's prompts: one token per row and forward, as many rows as rollouts
    assert all(m["gen_autoregressive/num_tokens"] > 0 for m in h_on)


def test_drafter_none_is_never_paired():
    spec = load_spec("micro", ["drafter.kind=none", "measure.paired=true"])
    assert spec.paired is False and load_spec("micro", ["measure.paired=true"]).paired is True
    assert load_spec("micro").paired is False  # null: off in wb run


def test_paired_metrics_by_hand():
    m = {"timing_s/gen": 2.0, "timing_s/gen_autoregressive": 3.0, "timing_s/step": 5.0}
    c = SpecCounters(num_generated_tokens=40, num_verify_steps=12)
    out = paired_metrics(m, c, ar_first=True)
    assert out["speedup/gen_per_step"] == pytest.approx(1.5)
    assert out["speedup/step_per_step"] == pytest.approx((5.0 - 2.0 + 3.0) / 5.0)
    assert "speedup/gen" not in out  # the run's estimate is the run loop's (workbench.stats.running_speedups)
    m["timing_s/draft_train"] = 1.5  # online adaptation: speculation's cost, not the plain step's
    assert paired_metrics(m, c, ar_first=True)["speedup/step_per_step"] == pytest.approx((5.0 - 2.0 - 1.5 + 3.0) / 5.0)
    assert (
        out["gen_autoregressive/num_tokens"],
        out["gen_autoregressive/num_forwards"],
        out["gen_autoregressive/first"],
    ) == (40, 12, 1)


def test_wb_run_paired_logs_step_ratios_and_the_run_ci(store):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["run", "micro", "measure.paired=true", "grpo.steps=4", "grpo.eval_every=0"])
    assert res.exit_code == 0, res.output
    run = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])[0]

    def history(key):
        return [m.value for m in sorted(store.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    ratios = history("speedup/gen_per_step")  # the raw per-step ratios: autoregressive gen s / speculative gen s
    ar, gen = history("timing_s/gen_autoregressive"), history("timing_s/gen")
    assert len(ratios) == 4 and ratios == pytest.approx([a / g for a, g in zip(ar, gen)])
    m = run.data.metrics
    import math

    geo = math.exp(sum(math.log(r) for r in ratios[1:]) / 3)  # warm-up step 1 left out
    assert m["speedup/gen_mean"] == pytest.approx(geo)
    assert m["speedup/gen_ci95_low"] <= geo <= m["speedup/gen_ci95_high"] and m["speedup/gen_n"] == 3
    # speedup/gen, the column MLflow's runs table shows (its last value): the running estimate, ending on the run's
    est = history("speedup/gen")
    assert (
        len(est) == 4
        and est[0] == pytest.approx(ratios[0])
        and est[2] == pytest.approx(math.sqrt(ratios[1] * ratios[2]))
    )
    assert m["speedup/gen"] == pytest.approx(m["speedup/gen_mean"], rel=1e-9) and est[-1] == m["speedup/gen"]
    assert m["speedup/step"] == pytest.approx(m["speedup/step_mean"], rel=1e-9)
    assert "speedup/gen (paired, 95 % CI)" in res.output
