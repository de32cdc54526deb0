"""A workbench sweep as the simulator's workload, acceptance and measurements (read from MLflow).

What a sweep stored in MLflow gives ``wb simulate --from-sweep NAME``: the command resolves it with the
report code (:func:`workbench.report.target.resolve`: one row per setting, repeats pooled, the paired
gen speedup with its 95 % CI) and hands it over as a :class:`MeasuredSweep`; :func:`read_sweep` reads

- per point (drafter kind, k): the per-position acceptance rates ``spec/acceptance_rate_pos_<i>``
  and the share of row-steps without a draft (n-gram misses; :func:`row_steps_of`),
  means over the point's runs; the measured paired ``speedup/gen`` [95 % CI]: over ≥ 2 runs (seeds)
  the repeat-aware random-effects estimate :func:`workbench.stats.runs_ci` over the runs' per-step
  ratios (its τ, the between-run spread, kept beside it), one run's per-step CI otherwise (as the
  sweep table, :func:`workbench.sweep.results.paired_interval`); and, for comparison, the runs'
  own deterministic ``speedup/gen_modeled`` (their *counted* forwards × the same cost curves);
- the workload, shared by every point: rows per GRPO step (prompts × G), rows decoded together
  (``rollout.max_batch_size``) and how (``rollout.continuous_batching``: true, waiting rows join the
  slots finished rows leave; false or not logged, as before the engine had it: consecutive chunks), ``max_new_tokens``,
  the prompt length (tokens, from the task's prompts and the target's tokenizer unless given), and the completion
  lengths: the steps the runs logged, row by row and grouped by prompt (``completions/lengths/``,
  :mod:`workbench.grpo.completions`), drawn whole (:meth:`workbench.perf.simulate.lengths.MeasuredLengths.step_draws`);
  runs from before they were logged fall back to a lognormal (:func:`workbench.perf.simulate.rollout.lognormal_lengths`)
  fitted to two logged means pooled over the runs: tokens per row (``gen/num_tokens`` / rows) and the autoregressive
  arm's decode forwards per step (``gen_autoregressive/num_forwards``: chunks, Σ over batches of the
  longest row − 1; continuous, the end of the slot schedule; either sets the long tail:
  :func:`decode_forwards`): :func:`fit_length_cv`. Independent lognormal rows cannot express a group
  whose rows all finish alike, which is why measured lengths are preferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench import metrics as M
from workbench.perf.simulate.lengths import MeasuredLengths, NoLengthsLogged, read_run_lengths
from workbench.perf.simulate.rollout import lognormal_lengths
from workbench.perf.simulate.run import solve_monotone
from workbench.perf.steps import emit_pmf, slot_schedule
from workbench.perf.sweep_runs import SweepRun
from workbench.rollout.cost import tokens_per_step
from workbench.runs import RunRecord
from workbench.stats import RatioCI, RunsCI

CV_MAX = 3.0


@dataclass
class MeasuredRow:
    """One setting of a measured sweep, repeats pooled: the run heading it, its runs that did not fail,
    its paired gen speedup [95 % CI] (``paired`` False: a ratio of means, no interval) and the
    random-effects estimate behind it (>= 2 runs)."""

    run: RunRecord
    runs: list[RunRecord]
    gen: RatioCI | None
    paired: bool
    gen_runs: RunsCI | None = None

    def mean(self, key: str) -> float | None:
        """Mean over the runs of :meth:`workbench.runs.RunRecord.mean` (each after its warm-up)."""
        vals = [m for r in self.runs if (m := r.mean(key)) is not None]
        return sum(vals) / len(vals) if vals else None


@dataclass
class MeasuredSweep:
    """A sweep as stored in MLflow: its name, store, runs (one per point) and rows (settings)."""

    name: str
    tracking_uri: str
    runs: list[RunRecord]
    rows: list[MeasuredRow]


@dataclass
class SweepPoint:
    """One speculative setting of the sweep (repeats pooled)."""

    kind: str
    k: int
    per_pos: list[float]  # P(draft position i accepted)
    no_draft: float  # share of row-steps without a draft (they emit one token)
    measured: RatioCI | None  # paired gen speedup, geometric mean [95 % CI]
    modeled: float | None  # the run's speedup/gen_modeled (counted forwards × cost curves)
    run_ids: list[str]
    params: dict[str, str]
    runs: RunsCI | None = None  # the random-effects estimate behind ``measured`` (≥ 2 runs), else None

    @property
    def interval(self) -> str:
        """What ``measured``'s CI covers: ``runs`` (random effects over the seeds) or ``steps`` (one run's steps)."""
        return "runs" if self.runs is not None else "steps"

    @property
    def acceptance_length(self) -> float:
        return 1.0 + float(sum(self.per_pos))

    @property
    def pmf(self) -> np.ndarray:
        """P(one verification step emits j + 1 tokens), j = 0..k."""
        return emit_pmf(self.per_pos, self.no_draft)

    @property
    def label(self) -> str:
        return f"{self.kind} k={self.k}"


@dataclass
class SweepWorkload:
    """What every point of the sweep shares, and its points (tokens; seconds nowhere)."""

    name: str
    tracking_uri: str
    rows: int  # rollouts per GRPO step
    chunk: int  # rows decoded together (batch slots)
    max_new_tokens: int
    mean_len: float  # tokens per completion
    ar_forwards: float  # autoregressive decode forwards per GRPO step (measured)
    cv: float = 0.0  # coefficient of variation of completion lengths (measured, or fitted)
    measured: MeasuredLengths | None = None  # the runs' logged per-row lengths; None: the lognormal fit
    lengths_note: str = ""  # why the lognormal fit was used
    prompt_len: int = 0
    continuous: bool = False  # rows > chunk and rollout.continuous_batching: rows join the slots finished rows leave
    points: list[SweepPoint] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "label: why"

    def lengths(self, draws: int, seed: int = 0) -> list[np.ndarray]:
        """``draws`` GRPO steps' completion lengths (rows each): measured steps drawn whole, or lognormal
        (mean_len, cv) cut at max_new_tokens."""
        rng = np.random.default_rng(seed)
        if self.measured is not None:
            return self.measured.step_draws(draws, rng)
        return [lognormal_lengths(self.rows, self.mean_len, self.cv, self.max_new_tokens, rng) for _ in range(draws)]


def chunk_forwards(lengths: np.ndarray, chunk: int) -> int:
    """Decode forwards of one GRPO step's batches: Σ over batches of ``chunk`` rows of (longest − 1)."""
    return int(sum(max(int(lengths[i : i + chunk].max()) - 1, 0) for i in range(0, len(lengths), chunk)))


def decode_forwards(lengths: np.ndarray, chunk: int, continuous: bool = False) -> int:
    """Autoregressive decode forwards of one GRPO step's rows: :func:`chunk_forwards`, or (``continuous``)
    the end of their :func:`workbench.perf.steps.slot_schedule` in ``chunk`` slots (L − 1 forwards a row)."""
    if not continuous:
        return chunk_forwards(lengths, chunk)
    return int(slot_schedule(np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0), chunk)[0])


def continuous_of(params: dict[str, str], rows: int, chunk: int) -> bool:
    """Whether a run batched continuously: ``rollout.continuous_batching`` true (runs logged before the
    engine had it have no such param and decoded in chunks) and more rows than slots."""
    return (
        str(params.get("rollout.continuous_batching", "false")).strip().lower() in ("true", "1", "yes") and rows > chunk
    )


def fit_length_cv(
    mean_len: float,
    forwards: float,
    rows: int,
    chunk: int,
    max_len: int,
    draws: int = 200,
    seed: int = 0,
    continuous: bool = False,
) -> float:
    """The cv of lognormal lengths (mean ``mean_len``) whose expected :func:`decode_forwards` equals the
    measured ``forwards`` (fixed-seed draws, the same normal deviates at every cv); 0 when ``forwards`` is at
    or below that of constant lengths, :data:`CV_MAX` when above what cv = CV_MAX gives."""

    def f(cv: float) -> float:
        rng = np.random.default_rng(seed)
        return float(
            np.mean(
                [
                    decode_forwards(lognormal_lengths(rows, mean_len, cv, max_len, rng), chunk, continuous)
                    for _ in range(draws)
                ]
            )
        )

    if forwards <= f(0.0):
        return 0.0
    if forwards >= f(CV_MAX):
        return CV_MAX
    return solve_monotone(f, forwards, 0.0, CV_MAX, rtol=1e-3)


def row_steps_of(run: SweepRun) -> tuple[float, float]:
    """(row-steps R, share of them without a draft) from the run's counters (module doc: undrafted row-steps from the
    token count)."""
    emitted = run.means[M.NUM_TOKENS] - run.rows  # the prefill emits each row's first token
    if run.is_baseline:
        return emitted, 1.0
    drafts = run.means.get(M.NUM_DRAFTS, 0.0)
    undrafted = max(0.0, emitted - drafts * tokens_per_step(run.per_pos))
    total = drafts + undrafted
    return total, (undrafted / total if total else 0.0)


def _int(params: dict[str, str], key: str, default: int) -> int:
    try:
        return int(params.get(key, default))
    except (TypeError, ValueError):
        return default


def prompt_tokens(params: dict[str, str], n: int = 256) -> int:
    """Mean prompt length (tokens, BOS included) of the first ``n`` training prompts of the run's task,
    with its target's tokenizer (as the rollout engine encodes them). Loads the task data and tokenizer."""
    from workbench.models.chat import run_prompt_format
    from workbench.models.checkpoint import load_tokenizer
    from workbench.models.resolve import resolve_model
    from workbench.perf.sweep_runs import spec_from_params
    from workbench.tasks.loading import spec_task_data

    spec = spec_from_params(params)
    t = spec.task
    tok = load_tokenizer(resolve_model(spec.model.target, progress=False, what="model.target"))
    data = spec_task_data(t, "train", t.num_train, spec.seed)
    fmt = run_prompt_format(t, tok)
    lens = [len(fmt.encode(p)) for p in data["prompt"][:n]]
    return int(round(sum(lens) / len(lens)))


def read_sweep(t: MeasuredSweep, prompt_len: int | None = None) -> SweepWorkload:
    """The sweep's workload and speculative points (module doc).

    Raises:
        ValueError: no FINISHED run, runs of different workloads (target, task, batch shape), or no
            speculative point with a paired speedup.
    """
    name = t.name
    runs = [r for r in t.runs if r.status == "FINISHED"]
    if not runs:
        raise ValueError(f"sweep {name!r} has no FINISHED run")
    p0 = runs[0].params
    for key in (
        "model.target",
        "task.name",
        "grpo.prompts_per_step",
        "grpo.group_size",
        "rollout.max_batch_size",
        "rollout.max_new_tokens",
        "rollout.continuous_batching",
    ):
        vals = sorted({r.params.get(key, "-") for r in runs})
        if len(vals) > 1:
            raise ValueError(
                f"sweep {name!r} mixes {key} = {', '.join(vals)}: one workload per check; report a sweep whose "
                "points share it"
            )
    rows = _int(p0, "grpo.prompts_per_step", 8) * _int(p0, "grpo.group_size", 8)
    chunk = min(rows, _int(p0, "rollout.max_batch_size", 256))
    lens = [m / rows for r in runs for key in (M.NUM_TOKENS, M.AR_NUM_TOKENS) if (m := r.mean(key)) is not None]
    fwd = [m for r in runs if (m := r.mean(M.AR_NUM_FORWARDS)) is not None]
    if not lens or not fwd:
        raise ValueError(
            f"sweep {name!r}: its runs logged no gen/num_tokens or gen_autoregressive/num_forwards (paired runs log "
            "them; measure.paired=true)"
        )
    wl = SweepWorkload(
        name,
        t.tracking_uri,
        rows,
        chunk,
        _int(p0, "rollout.max_new_tokens", 96),
        float(np.mean(lens)),
        float(np.mean(fwd)),
        continuous=continuous_of(p0, rows, chunk),
    )
    try:  # every run's logged lengths (all arms follow one law, docs/design.md §4)
        wl.measured = read_run_lengths([r.run_id for r in runs], t.tracking_uri)
        why_not = ""
    except NoLengthsLogged as e:  # runs from before lengths were logged
        wl.measured, why_not = None, str(e).split(" (")[0]
    if wl.measured is not None:
        bad = [(o, s.size) for o, s in zip(wl.measured.origins, wl.measured.steps) if s.size != rows]
        if bad:
            raise ValueError(
                f"sweep {name!r}: {bad[0][0]} holds {bad[0][1]} lengths, the sweep's steps {rows} rows "
                f"(grpo.prompts_per_step × grpo.group_size); {len(bad)} such record(s)"
            )
        wl.mean_len, wl.cv = wl.measured.mean, wl.measured.cv
    else:
        wl.cv = fit_length_cv(wl.mean_len, wl.ar_forwards, rows, chunk, wl.max_new_tokens, continuous=wl.continuous)
        wl.lengths_note = f"lognormal fitted to the mean and the AR forwards ({why_not})"
    wl.prompt_len = int(prompt_len) if prompt_len is not None else prompt_tokens(p0)
    for row in t.rows:
        run = row.run
        if run.is_baseline:
            continue
        label = f"{run.kind} k={run.k}"
        if row.gen is None or not row.paired or row.gen.low is None:
            wl.skipped.append(
                f"{label}: no paired gen speedup with a 95 % CI (measure.paired=true, ≥ 2 steps after warm-up)"
            )
            continue
        k = int(run.k or 0)
        per_pos = [row.mean(M.acceptance_rate_pos(i)) for i in range(k)]
        means = {key: row.mean(key) for key in (M.NUM_TOKENS, M.NUM_DRAFTS)}
        if any(v is None for v in per_pos) or any(v is None for v in means.values()):
            wl.skipped.append(f"{label}: no per-position acceptance or spec/num_drafts")
            continue
        sr = SweepRun(
            run.run_id,
            run.name,
            run.status,
            dict(run.params),
            {**means, **{M.acceptance_rate_pos(i): v for i, v in enumerate(per_pos)}},
        )
        _, no_draft = row_steps_of(sr)
        wl.points.append(
            SweepPoint(
                run.kind,
                k,
                [float(v) for v in per_pos],
                no_draft,
                row.gen,
                row.mean(M.SPEEDUP_GEN_MODELED),
                [x.run_id for x in row.runs],
                dict(run.params),
                row.gen_runs,
            )
        )
    if not wl.points:
        raise ValueError(
            f"sweep {name!r}: no speculative point with a paired gen speedup"
            + (f" ({'; '.join(wl.skipped)})" if wl.skipped else "")
        )
    wl.points.sort(key=lambda p: (p.kind, p.k))
    return wl
