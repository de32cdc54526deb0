"""generate_interleaved: round-robin order, per-arm time, outputs (fake arms and a fake clock)."""

from workbench.rollout.paired import generate_interleaved


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def arm(name, costs, clock, log):
    """A generator that takes ``costs[i]`` seconds on step i and returns ``name``."""
    for c in costs:
        log.append(name)
        clock.t += c
        yield
    return name


def test_round_robin_reverses_each_round_and_bills_each_arm_its_own_steps():
    clock, log = Clock(), []
    outs, secs = generate_interleaved([arm("A", [1, 1, 1], clock, log), arm("B", [10, 10], clock, log)], clock, first=0)
    assert outs == ["A", "B"]
    assert secs == [3.0, 20.0]
    assert log == ["A", "B", "B", "A", "A"]  # A B | B A | A (B has returned)


def test_first_arm_opens():
    clock, log = Clock(), []
    generate_interleaved([arm("A", [1], clock, log), arm("B", [1], clock, log)], clock, first=1)
    assert log == ["B", "A"]


def test_interleaved_engine_outputs_equal_separate_runs(target_lm, draft_lm):
    """Interleaving changes timing only: each arm's rollouts equal the same arm run alone."""
    import time

    import torch

    from drafters.draft_model import DraftModelDrafter
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams

    from conftest import PROMPTS

    sp = SamplingParams(temperature=1.0, max_new_tokens=20, eos_token_id=2)
    spec_engine = RolloutEngine(target_lm, DraftModelDrafter(draft_lm), k=3)
    ar_engine = RolloutEngine(target_lm, None)
    alone = [
        spec_engine.generate(PROMPTS, sp, torch.Generator().manual_seed(5)).tokens,
        ar_engine.generate(PROMPTS, sp, torch.Generator().manual_seed(6)).tokens,
    ]
    (a, b), secs = generate_interleaved(
        [
            spec_engine.generate_steps(PROMPTS, sp, torch.Generator().manual_seed(5)),
            ar_engine.generate_steps(PROMPTS, sp, torch.Generator().manual_seed(6)),
        ],
        time.perf_counter,
    )
    assert [a.tokens, b.tokens] == alone and min(secs) > 0
