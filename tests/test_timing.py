"""StageTimer bookkeeping. A fake clock makes the numbers exact; no wall-time thresholds."""

import time

import pytest
import torch

import workbench.timing as timing
from workbench.timing import StageTimer


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    return c


def test_stages_other_and_fractions(clock):
    timer = StageTimer(torch.device("cpu"))
    timer.start_step()
    clock.sleep(0.5)  # not in any stage -> "other"
    with timer.stage("data"):
        clock.sleep(1.0)
    with timer.stage("gen"):
        clock.sleep(2.0)
    clock.sleep(0.25)
    with timer.stage("gen"):  # same stage again in one step accumulates
        clock.sleep(3.0)
    m = timer.end_step()
    assert m["timing_s/data"] == pytest.approx(1.0)
    assert m["timing_s/gen"] == pytest.approx(5.0)
    assert m["timing_s/step"] == pytest.approx(6.75)
    assert m["timing_s/other"] == pytest.approx(0.75)
    assert m["timing_s/data"] + m["timing_s/gen"] + m["timing_s/other"] == pytest.approx(m["timing_s/step"])
    assert m["timing_frac/gen"] == pytest.approx(5.0 / 6.75)
    assert m["timing_frac/data"] + m["timing_frac/gen"] + m["timing_frac/other"] == pytest.approx(1.0)
    assert "timing_s/train" not in m  # only stages run this step


def test_steps_are_independent(clock):
    timer = StageTimer()
    timer.start_step()
    with timer.stage("train"):
        clock.sleep(1.0)
    timer.end_step()
    timer.start_step()
    with timer.stage("logprob"):
        clock.sleep(2.0)
    m = timer.end_step()
    assert "timing_s/train" not in m
    assert m["timing_s/logprob"] == pytest.approx(2.0) and m["timing_s/other"] == pytest.approx(0.0)


def test_zero_length_step(clock):
    timer = StageTimer()
    timer.start_step()
    with timer.stage("gen"):
        pass
    m = timer.end_step()
    assert m["timing_s/step"] == 0.0 and m["timing_frac/gen"] == 0.0


def test_stage_time_kept_when_body_raises(clock):
    timer = StageTimer()
    timer.start_step()
    with pytest.raises(RuntimeError):
        with timer.stage("reward"):
            clock.sleep(1.5)
            raise RuntimeError("boom")
    with timer.stage("train"):  # the timer is usable again: the failed stage was closed
        clock.sleep(1.0)
    m = timer.end_step()
    assert m["timing_s/reward"] == pytest.approx(1.5) and m["timing_s/train"] == pytest.approx(1.0)


def test_misuse_errors(clock):
    timer = StageTimer()
    with pytest.raises(ValueError, match="start_step"):
        with timer.stage("gen"):
            pass
    with pytest.raises(ValueError):
        timer.end_step()
    timer.start_step()
    with timer.stage("gen"):
        with pytest.raises(ValueError, match="nest"):
            with timer.stage("reward"):
                pass
        with pytest.raises(ValueError):
            timer.end_step()
    for bad in ("", "a/b", "step", "other"):
        with pytest.raises(ValueError):
            with timer.stage(bad):
                pass
    assert timer.end_step()["timing_s/gen"] >= 0


def test_real_clock_relationships():
    timer = StageTimer("cpu")
    timer.start_step()
    with timer.stage("data"):
        time.sleep(0.002)
    with timer.stage("gen"):
        time.sleep(0.002)
    m = timer.end_step()
    assert all(v >= 0 for v in m.values())
    assert m["timing_s/data"] + m["timing_s/gen"] + m["timing_s/other"] == pytest.approx(m["timing_s/step"], abs=1e-9)
    assert m["timing_s/step"] >= m["timing_s/data"] + m["timing_s/gen"] - 1e-9


def test_measurement_stage_is_reported_but_not_counted_in_the_step(clock):
    timer = StageTimer(torch.device("cpu"))
    timer.start_step()
    with timer.stage("gen"):
        clock.sleep(2.0)
    with timer.stage("gen_autoregressive", measurement=True):
        clock.sleep(3.0)
    clock.sleep(0.5)
    with timer.stage("train"):
        clock.sleep(1.5)
    m = timer.end_step()
    assert m["timing_s/gen_autoregressive"] == pytest.approx(3.0)
    assert m["timing_s/step"] == pytest.approx(4.0)  # 7 s of wall time less the 3 s measurement
    assert m["timing_s/other"] == pytest.approx(0.5)
    assert m["timing_frac/gen"] == pytest.approx(0.5)
    assert "timing_frac/gen_autoregressive" not in m


def test_a_name_cannot_be_both_stage_and_measurement(clock):
    timer = StageTimer(torch.device("cpu"))
    timer.start_step()
    with timer.stage("gen"):
        pass
    with pytest.raises(ValueError, match="both"):
        with timer.stage("gen", measurement=True):
            pass


def test_move_rebills_seconds_from_a_stage_to_a_measurement(clock):
    timer = StageTimer(torch.device("cpu"))
    timer.start_step()
    with timer.stage("gen"):
        clock.sleep(5.0)  # both arms of an interleaved paired generation
    timer.move("gen", "gen_autoregressive", 3.0)
    m = timer.end_step()
    assert (m["timing_s/gen"], m["timing_s/gen_autoregressive"], m["timing_s/step"]) == pytest.approx((2.0, 3.0, 2.0))
    timer.start_step()
    with timer.stage("gen"):
        clock.sleep(1.0)
    with pytest.raises(ValueError, match="cannot move"):
        timer.move("gen", "gen_autoregressive", 2.0)


def test_cpu_isa_names_the_vector_and_matrix_sets_from_the_flags():
    from workbench.timing import cpu_isa

    assert cpu_isa("fpu sse avx2 avx512f avx512_vnni") == ["AVX2", "AVX-512", "AVX-512 VNNI"]
    assert cpu_isa("avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8")[-3:] == ["AMX", "AMX-BF16", "AMX-INT8"]
    assert cpu_isa("fpu sse") == [] and cpu_isa("") == []


def test_host_description_names_the_cpu_model_and_its_sets(monkeypatch):
    import torch

    import workbench.timing as timing

    monkeypatch.setattr(timing, "device_name", lambda d: "Some Xeon @ 2.8GHz")
    monkeypatch.setattr(timing, "cpu_isa", lambda flags=None: ["AVX2", "AMX"])
    assert timing.host_description(torch.device("cpu")) == "Some Xeon @ 2.8GHz (AVX2, AMX)"
    monkeypatch.setattr(timing, "cpu_isa", lambda flags=None: [])
    assert timing.host_description(torch.device("cpu")) == "Some Xeon @ 2.8GHz"
