"""Wall-clock timing of the stages of one RL step (docs/design.md §3).

    timer = StageTimer(device)
    timer.start_step()
    with timer.stage("gen"):
        ...
    with timer.stage("gen_autoregressive", measurement=True):
        ...                       # a measurement's own work (the paired baseline), not the step's
    metrics = timer.end_step()   # {"timing_s/gen": ..., "timing_s/step": ..., "timing_s/other": ..., "timing_frac/gen": ...}

A *measurement* stage is work the workbench adds to measure the step (the paired autoregressive
generation), not work of the RL step: it is logged as ``timing_s/<name>`` but left out of
``timing_s/step``, ``timing_s/other`` and the ``timing_frac/*`` shares, so a step's time and stage
shares read the same with and without the measurement.

CUDA kernels run asynchronously, so without a barrier the time of a stage's kernels would be
billed to whichever later stage happens to block. On CUDA every boundary calls
``torch.cuda.synchronize`` so each stage is charged for its own work. All times in seconds,
from ``time.perf_counter``.

The same barrier times single calls for the instruments that measure forwards and engine steps
(``wb bench``, the cost curves of ``speedup/gen_modeled`` and of ``wb simulate --from-sweep``), so they all measure
alike:

    seconds, out = timed(lambda: lm(x, start, cache), device)        # one call, device-synchronised
    seconds, _ = timed(fn, device, repeat=10)                         # mean of 10 back-to-back calls
    spent = TimeSpent(device); drafter.propose = spent.wrap(drafter.propose)   # time inside a callee
"""  # noqa: E501 (a code example)

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import torch

from workbench import metrics as M

# The stage names of docs/design.md §2/§3, in step order; other names are allowed (e.g. "eval").
STAGES: tuple[str, ...] = ("data", "prepare", "gen", "reward", "logprob", "train", "draft_train")

T = TypeVar("T")


def barrier(device: torch.device | str | None) -> Callable[[], None]:
    """A function that waits for the work queued on ``device``: ``torch.cuda.synchronize`` on a
    CUDA device (when CUDA is available), a no-op elsewhere (CPU work is synchronous)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def timed(fn: Callable[[], T], device: torch.device | str | None = None, repeat: int = 1) -> tuple[float, T]:
    """(seconds per call, the last call's result) of ``repeat`` back-to-back calls of ``fn``, the
    device synchronised before (earlier work is not billed) and after (its own kernels are)."""
    sync = barrier(device)
    sync()
    t0 = time.perf_counter()
    for _ in range(max(repeat, 1)):
        out = fn()
    sync()
    return (time.perf_counter() - t0) / max(repeat, 1), out


class TimeSpent:
    """Seconds spent inside wrapped callables (device-synchronised around each call), e.g. a
    drafter's ``propose`` inside a whole generation. ``seconds`` accumulates; reset it to 0.0."""

    def __init__(self, device: torch.device | str | None = None):
        self.seconds = 0.0
        self._device = device

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a, **kw):
            dt, out = timed(lambda: fn(*a, **kw), self._device)
            self.seconds += dt
            return out

        return wrapper


class StageTimer:
    """Accumulates per-stage wall time within one step; see the module docstring for the API.

    Rules: stages do not nest (ValueError); a stage run twice in one step accumulates;
    ``stage`` and ``end_step`` need an open step (ValueError otherwise).
    """

    def __init__(self, device: torch.device | str | None = None):
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self._sync = barrier(dev)
        self.device = dev
        self._step_t0: float | None = None
        self._current: str | None = None
        self._stages: dict[str, float] = {}
        self._measured: dict[str, float] = {}

    def now(self) -> float:
        """Seconds (perf_counter), after synchronising the CUDA device if the timer is on one."""
        self._sync()
        return time.perf_counter()

    _now = now

    def move(self, stage: str, measurement: str, seconds: float) -> None:
        """Re-bill ``seconds`` that ran inside ``stage`` to the measurement ``measurement`` (the
        paired generation interleaved with ``gen``). Raises ValueError if the stage has less."""
        if self._stages.get(stage, 0.0) + 1e-9 < seconds:
            raise ValueError(
                f"cannot move {seconds:.6f} s out of stage {stage!r}, which has {self._stages.get(stage, 0.0):.6f} s"
            )
        if measurement in self._stages:
            raise ValueError(f"stage {measurement!r} is used both as a step stage and as a measurement")
        self._stages[stage] -= seconds
        self._measured[measurement] = self._measured.get(measurement, 0.0) + seconds

    def start_step(self) -> None:
        """Open a step (discarding any unfinished one) and start its wall clock."""
        if self._current is not None:
            raise ValueError(f"start_step() called inside stage {self._current!r}")
        self._stages, self._measured = {}, {}
        self._step_t0 = self._now()

    @contextmanager
    def stage(self, name: str, measurement: bool = False) -> Iterator[None]:
        """Time the body as stage ``name``; the time is kept even if the body raises.

        ``measurement=True``: the body is the workbench's own measuring work (see the module
        docstring); its time is reported but not counted in the step."""
        if self._step_t0 is None:
            raise ValueError(f"stage {name!r} started outside a step; call start_step() first")
        if self._current is not None:
            raise ValueError(f"stage {name!r} started inside stage {self._current!r}; stages do not nest")
        if not name or "/" in name or name in ("step", "other"):
            raise ValueError(f"invalid stage name {name!r}: non-empty, no '/', not 'step' or 'other'")
        into = self._measured if measurement else self._stages
        if name in (self._stages if measurement else self._measured):
            raise ValueError(f"stage {name!r} is used both as a step stage and as a measurement")
        self._current = name
        t0 = self._now()
        try:
            yield
        finally:
            into[name] = into.get(name, 0.0) + (self._now() - t0)
            self._current = None

    def end_step(self) -> dict[str, float]:
        """Close the step and return its metrics.

        Keys: ``timing_s/<stage>`` for each stage and measurement run this step, ``timing_s/step``
        (start_step to end_step, less the measurements), ``timing_s/other`` (step minus the sum of stages: time no stage
        covered), ``timing_frac/<stage>`` and ``timing_frac/other`` (share of the step, 0 if the step took 0 s).
        """
        if self._step_t0 is None:
            raise ValueError("end_step() without start_step()")
        if self._current is not None:
            raise ValueError(f"end_step() called inside stage {self._current!r}")
        step = max(self._now() - self._step_t0 - sum(self._measured.values()), 0.0)
        self._step_t0 = None
        # Stages lie inside the step, so this is >= 0 except for float rounding; clamp that away.
        other = max(step - sum(self._stages.values()), 0.0)
        out: dict[str, float] = {M.timing(k): v for k, v in {**self._stages, **self._measured}.items()}
        out[M.STEP_S] = step
        out[M.OTHER_S] = other
        for k, v in [*self._stages.items(), ("other", other)]:
            out[M.timing_frac(k)] = v / step if step > 0 else 0.0
        return out


class Timing(NamedTuple):
    """One contender's measurement: median seconds per call, the last call's output, and its peak
    CUDA memory in MiB (None off CUDA)."""

    seconds: float
    out: object
    peak_mib: float | None
    all_s: tuple[float, ...] = ()  # every timed call's seconds, in order (paired repeats)


def measure(fn: Callable[[], object], device: torch.device | None) -> Timing:
    """One device-synchronised call of ``fn`` (:func:`workbench.timing.timed`): seconds, output and,
    on CUDA, the peak memory the call allocated above what was allocated before it (KV caches,
    activations, compile workspaces and CUDA-graph pools; the resident weights are not counted),
    in MiB, from ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``."""
    if device is None or torch.device(device).type != "cuda":
        return Timing(*timed(fn, device), None)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    dt, out = timed(fn, device)
    return Timing(dt, out, (torch.cuda.max_memory_allocated(device) - before) / 2**20)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model (``/proc/cpuinfo`` where there is one): which machine a timing
    kept on disk (cost curves, packing thresholds) was measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction sets that decide where a CPU's GEMMs turn compute-bound (and so where speculation pays):
# /proc/cpuinfo flag -> the name people use. VM hosts differ from day to day (AMX one day, AVX-512 only the next).
CPU_ISA_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "avx512_fp16": "AVX-512 FP16",
    "amx_tile": "AMX",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
}


def cpu_isa(flags: str | None = None) -> list[str]:
    """The CPU's vector and matrix instruction sets among :data:`CPU_ISA_FLAGS`, by their usual names
    (e.g. ``["AVX2", "AVX-512", "AVX-512 VNNI", "AMX", "AMX-BF16"]``); [] where unknown.

    Args:
        flags: a ``flags`` line of ``/proc/cpuinfo`` (space-separated); None reads this machine's.
    """
    if flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1] for line in f if line.startswith("flags")), "")
        except OSError:
            flags = ""
    have = set(flags.split())
    return [name for flag, name in CPU_ISA_FLAGS.items() if flag in have]


def host_description(device: torch.device) -> str:
    """Which machine a timing was taken on, as results pages name it: the GPU's name, or the CPU model
    with its instruction sets (``Intel(R) Xeon(R) Processor @ 2.80GHz (AVX2, AVX-512, AVX-512 VNNI)``)."""
    name = device_name(device)
    if device.type == "cuda":
        return name
    isa = cpu_isa()
    return f"{name} ({', '.join(isa)})" if isa else name
