"""The drafter-health alarm: the rule on hand-made acceptance series, and a run whose drafter breaks at a
weight sync mid-run (warn: spec/drafter_health 0 logged and one warning; fail: the run FAILED, exit 1)."""

import pytest
import torch
from typer.testing import CliRunner

from workbench import metrics as M
from workbench.grpo.drafter_health import DrafterCollapse, DrafterHealth, collapse_reason
from workbench.specs import SpecError, load_spec


def test_about_zero_after_healthy_steps_is_a_collapse():
    assert collapse_reason([], 0.0) is None  # nothing to compare with at the first step
    assert "about zero" in collapse_reason([0.6], 0.01)
    assert collapse_reason([0.05, 0.08], 0.0) is None  # a drafter that never accepted much: no alarm
    assert collapse_reason([0.6], 0.3) is None  # the band needs 3 steps; 0.3 is not about zero
    assert "about zero" in collapse_reason([0.89], 0.05)  # under a tenth of the median: a broken drafter's chance hits
    assert collapse_reason([0.89], 0.1) is None


def test_a_drop_outside_the_runs_own_band_is_a_collapse():
    steady = [0.80, 0.805, 0.795, 0.80, 0.80]  # median 0.80, MAD 0: a quarter of the median below -> 0.60
    assert collapse_reason(steady, 0.61) is None
    assert "band 0.600" in collapse_reason(steady, 0.59)
    assert "band 0.503" in collapse_reason([0.80, 0.90, 0.70, 0.85, 0.75], 0.50)  # MAD 0.05: 4 x 1.4826 x 0.05
    low = [0.15, 0.155, 0.145, 0.15, 0.15]  # a quarter of 0.15 is under the 0.05 floor -> 0.10
    assert collapse_reason(low, 0.11) is None and "band 0.100" in collapse_reason(low, 0.09)
    # a policy drifting from its drafter (quickstart, draft_model k = 5, nothing broken) is no collapse
    assert collapse_reason([0.599, 0.600, 0.598], 0.511) is None
    noisy = [0.5, 0.7, 0.6, 0.4, 0.8]  # median 0.6, MAD 0.1: 4 x 1.4826 x 0.1 = 0.593 below -> 0.007
    assert collapse_reason(noisy, 0.07) is None  # inside the wide band, above a tenth of the median
    assert "about zero" in collapse_reason(noisy, 0.05)  # the zero rule still applies
    assert collapse_reason(steady, 0.99) is None  # rises never alarm
    assert collapse_reason(steady[:2], 0.5) is None  # two steps: no band yet


def test_the_alarm_warns_once_keeps_collapsed_steps_out_of_the_band_and_fails_when_asked():
    warned = []
    h = DrafterHealth("warn", warned.append)
    series = [0.8, 0.81, 0.79, 0.0, 0.0, 0.8]
    got = [h.check(i + 1, {M.ACCEPTANCE_RATE: a, M.NUM_DRAFT_TOKENS: 10.0}) for i, a in enumerate(series)]
    assert [g[M.DRAFTER_HEALTH] for g in got] == [1, 1, 1, 0, 0, 1]
    assert len(warned) == 1 and "drafter collapsed at step 4" in warned[0] and "on_collapse=fail" in warned[0]
    assert h.history == [0.8, 0.81, 0.79, 0.8]  # the collapse never became the band's normal
    h.raise_if_failed()  # warn: never raises
    assert h.check(7, {M.TOKENS_PER_S: 1.0}) == {}  # no drafts this step (plain decoding): not judged
    assert h.check(8, {M.ACCEPTANCE_RATE: 0.0, M.NUM_DRAFT_TOKENS: 0.0}) == {}
    f = DrafterHealth("fail")
    f.check(1, {M.ACCEPTANCE_RATE: 0.7})
    f.check(2, {M.ACCEPTANCE_RATE: 0.0})
    with pytest.raises(DrafterCollapse, match=r"^drafter collapsed at step 2: acceptance 0.000 is about zero"):
        f.raise_if_failed()


def test_the_spec_field():
    assert load_spec("micro", []).drafter.on_collapse == "warn"
    assert load_spec("micro", ["drafter.on_collapse=fail"]).drafter.on_collapse == "fail"
    with pytest.raises(SpecError, match="on_collapse"):
        load_spec("micro", ["drafter.on_collapse=stop"])


def _break_the_drafter_after_step_1(monkeypatch):
    """From step 2's weight sync on, the draft model's embeddings are random, as a sync that loaded
    the wrong tensors would leave it (its drafts then agree with the target by chance, 2-3 %)."""
    from workbench.grpo import trainer as trainer_mod

    real_step = trainer_mod.GRPOTrainer.step

    def step(self, n, on_stage=None):
        if n == 2:
            emb = self.backend.drafter.model.model.embed_tokens.weight
            emb.data.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
        return real_step(self, n, on_stage)

    monkeypatch.setattr(trainer_mod.GRPOTrainer, "step", step)


RUN = ["micro", "grpo.steps=4", "grpo.eval_every=0"]


def _only_run(store):
    runs = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])
    assert len(runs) == 1
    return runs[0]


def _health(store, run_id):
    return [(m.step, m.value) for m in sorted(store.get_metric_history(run_id, M.DRAFTER_HEALTH), key=lambda m: m.step)]


def test_a_drafter_broken_mid_run_logs_its_health_and_warns_once(store, monkeypatch):
    from workbench.cli import app, common

    monkeypatch.setattr(common.console, "width", 250)
    _break_the_drafter_after_step_1(monkeypatch)
    res = CliRunner().invoke(app, ["run", *RUN])
    assert res.exit_code == 0, res.output
    assert res.output.count("drafter collapsed at step 2") == 1, res.output  # warned once, not per step
    run = _only_run(store)
    acc = [m.value for m in store.get_metric_history(run.info.run_id, M.ACCEPTANCE_RATE)]
    assert acc[0] > 0.3 and max(acc[1:]) < 0.1 * acc[0], acc
    assert _health(store, run.info.run_id) == [(1, 1.0), (2, 0.0), (3, 0.0), (4, 0.0)]
    assert run.info.status == "FINISHED"


def test_on_collapse_fail_ends_the_run_failed_with_one_line(store, monkeypatch):
    from workbench.cli import app, common

    monkeypatch.setattr(common.console, "width", 250)
    _break_the_drafter_after_step_1(monkeypatch)
    res = CliRunner().invoke(app, ["run", *RUN, "drafter.on_collapse=fail"])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.output.splitlines() if "run FAILED" in line]
    assert len(lines) == 1 and "drafter collapsed at step 2: acceptance" in lines[0], res.output
    run = _only_run(store)
    assert run.info.status == "FAILED"
    assert "DrafterCollapse: drafter collapsed at step 2" in run.data.tags["workbench.error"]
    assert _health(store, run.info.run_id) == [(1, 1.0), (2, 0.0)]  # step 2 logged, then the run ended
