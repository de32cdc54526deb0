"""`wb export NAME`: a sweep's or study's best point (or one named) read from MLflow and written out as the
settings of the framework the user trains with (:mod:`workbench.report.export`).

NAME resolves as for `wb report` (:func:`workbench.report.target.resolve`: a sweep, a study, a parent
run, a run), with the same rows: repeats pooled, the paired generation speedup ``speedup/gen`` as a
geometric mean with its 95 % CI. The best point is the row with the highest speedup among speculative
rows whose runs all FINISHED (:func:`workbench.sweep.results.decide_rows`); when its CI does not clear
the others' the tie is named and the top row still exported. ``--point`` names a row by its label as
the report prints it (``ngram k=2``) or by ``KEY=VALUE[,KEY=VALUE...]`` (the sweep's aliases ``k``,
``drafter``, ``init``, ``online`` work). The point's spec is rebuilt from its run's params
(:func:`workbench.perf.spec_from_params`); an adaptive run's per-batch-size k (``spec/k_mean_rows_le_<b>``,
means after warm-up over the row's runs) becomes vLLM's ``num_speculative_tokens_per_batch_size``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drafters import drafter_class
from workbench import metrics as M
from workbench.report.export import (
    CHECKED,
    FILES,
    FORMATS,
    NO_VLLM,
    ExportError,
    framework_configs,
    per_batch_size_schedule,
    render_files,
)
from workbench.report.target import ReportError, Target, label, resolve, row_mean, row_runs
from workbench.sweep.results import Row, decide_rows

POINT_FILE = "point.json"  # what was exported, from which runs, checked against which versions


@dataclass
class Export:
    """What `wb export` wrote: the point (``label``; ``decided`` when its CI clears every other row's,
    ``tied`` the rows it ties with), its spec, the vLLM dict, the files and notes for the reader."""

    name: str
    kind: str
    label: str
    row: Row
    spec: Any
    speculative_config: dict[str, Any]
    out: Path
    files: list[Path] = field(default_factory=list)
    decided: bool = False
    tied: tuple[str, ...] = ()
    head: str | None = None
    head_source: str = ""
    notes: list[str] = field(default_factory=list)


def finished(row: Row) -> bool:
    return bool(row.outcomes) and all(r.status == "FINISHED" for r in row_runs(row, ok=False))


def parse_point(text: str) -> dict[str, str]:
    """``drafter.kind=ngram,k=3`` -> ``{"drafter.kind": "ngram", "drafter.k": "3"}`` (sweep aliases expanded)."""
    from workbench.sweep import ALIASES

    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ExportError(f"--point {text!r}: {item!r} is not KEY=VALUE; use e.g. --point drafter.kind=ngram,k=3")
        out[ALIASES.get(key.strip(), key.strip())] = value.strip()
    return out


def _same(a: str | None, b: str) -> bool:
    return a is not None and a.strip().lower() == b.strip().lower()


def matches(row: Row, want: dict[str, str]) -> bool:
    """Whether the row's (first) run has every ``want`` value: its ``workbench.axis.*`` tag, else its param."""
    r = row.point.run
    return all(_same(r.tags.get(f"workbench.axis.{k}", r.params.get(k)), v) for k, v in want.items())


def choose_row(t: Target, point: str | None) -> tuple[Row, bool, tuple[str, ...]]:
    """(row, decided, tied) for ``point`` (None: the best finished row, see the module docstring).

    Raises:
        ExportError: no finished speculative row with a speedup; a point that names no row, or several.
    """
    spec_rows = [r for r in t.rows if not r.point.is_baseline]
    names = ", ".join(repr(label(r)) for r in spec_rows) or "(none)"
    if point is not None:
        by_label = [r for r in spec_rows if label(r) == point.strip()]
        hits = by_label or ([r for r in spec_rows if matches(r, parse_point(point))] if "=" in point else [])
        if not hits:
            raise ExportError(f"--point {point!r} names no speculative point of {t.name!r}; its points: {names}")
        if len(hits) > 1:
            raise ExportError(
                f"--point {point!r} names {len(hits)} points of {t.name!r} ({', '.join(label(r) for r in hits)}); "
                "add the axis that tells them apart"
            )
        return hits[0], False, ()
    done = [r for r in spec_rows if finished(r) and r.gen is not None]
    if not done:
        raise ExportError(
            f"{t.kind} {t.name!r} has no FINISHED speculative point with a generation speedup (points: {names}); "
            "wait for the sweep to finish, or name one with --point"
        )
    dec, rows = decide_rows(done, label)
    return rows[dec.top], dec.best is not None, tuple(x for x in dec.tied if x != dec.top)


def k_by_batch(row: Row) -> dict[int, float]:
    """Mean chosen k_t per power-of-two batch-size bin over the row's runs (after warm-up); {} if not adaptive."""
    keys = {k for r in row_runs(row) for k in r.history if k.startswith(M.K_MEAN_BY_ROWS)}
    vals = {M.suffix_int(k, M.K_MEAN_BY_ROWS): row_mean(row, k) for k in keys}
    return {b: v for b, v in vals.items() if v is not None}


def _ci_json(row: Row) -> dict[str, Any]:
    ci = row.gen
    return {"mean": ci.mean, "ci95_low": ci.low, "ci95_high": ci.high, "paired": row.paired} if ci else {"mean": None}


def _speedup(row: Row) -> str:
    from workbench.report.tables import fmt_ci

    return fmt_ci(row.gen, row.paired)


def export_point(
    name: str,
    point: str | None = None,
    out: str | Path | None = None,
    formats: tuple[str, ...] = FORMATS,
    tracking_uri: str | None = None,
    progress: bool = False,
) -> Export:
    """Resolve NAME, choose the point, write :data:`FILES` of ``formats`` (and ``point.json``; the drafter
    folder where the kind has one) into ``out`` (default ``exports/<NAME>``).

    Raises:
        ExportError: NAME matches nothing (lists what exists), no finished point, an unknown point, a kind
            vLLM does not run, a drafter that cannot be rebuilt (names the field).
    """
    from workbench.perf.sweep_runs import spec_from_params
    from workbench.report.export_head import drafter_folder_of
    from workbench.report.write import safe_dirname

    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ExportError(f"--format {bad[0]!r}: use one of {', '.join(FORMATS)} or all")
    try:
        t = resolve(name, tracking_uri)
    except ReportError as e:
        raise ExportError(str(e)) from None
    row, decided, tied = choose_row(t, point)
    run = row.point.run
    try:
        spec = spec_from_params(run.params)
    except ValueError as e:
        raise ExportError(f"run {run.run_id}: its params do not make a spec this workbench reads: {e}") from None
    d = spec.drafter
    if d.kind in NO_VLLM:
        raise ExportError(f"point {label(row)!r}: {NO_VLLM[d.kind]}")
    dest = Path(out) if out else Path("exports") / safe_dirname(name)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        head, source = drafter_folder_of(spec, dest.resolve(), progress=progress)
    except ValueError as e:
        raise ExportError(f"point {label(row)!r}: cannot rebuild its drafter: {e}") from None
    schedule = per_batch_size_schedule(k_by_batch(row), d.k) if d.adaptive else None
    cfgs = framework_configs(d, d.k, head, spec.rollout.vllm.draft_sample_method, schedule)
    ex = Export(name, t.kind, label(row), row, spec, cfgs["vllm"], dest, [], decided, tied, head, source)
    ex.notes = notes(ex, schedule)
    header = [
        f"wb export {name}: point {ex.label!r} ({t.kind}), gen speedup {_speedup(row)}, "
        f"runs {' '.join(r.run_id for r in row_runs(row))}",
        f"speculative_config checked against {CHECKED['vllm']}",
    ]
    for fname, text in render_files(cfgs, header, spec.model.target, formats).items():
        (dest / fname).write_text(text)
        ex.files.append(dest / fname)
    if "trl" in formats:
        (dest / FILES["trl"]).chmod(0o755)
    info = {
        "name": name,
        "kind": t.kind,
        "point": ex.label,
        "decided": decided,
        "tied_with": list(tied),
        "runs": [r.run_id for r in row_runs(row)],
        M.SPEEDUP_GEN: _ci_json(row),
        "drafter": d.model_dump(mode="json", exclude={"init", "online"}),
        "speculative_config": cfgs["vllm"],
        "drafter_folder": head,
        "drafter_source": source,
        "checked_against": CHECKED,
        "notes": ex.notes,
        "files": [FILES[f] for f in formats],
    }
    (dest / POINT_FILE).write_text(json.dumps(info, indent=2) + "\n")
    ex.files.append(dest / POINT_FILE)
    return ex


def notes(ex: Export, schedule) -> list[str]:
    """What the reader of the export should know about this point (ties, online adaptation, kind caveats)."""
    d, out = ex.spec.drafter, []
    if ex.tied:
        out.append(
            f"tie: {ex.label} is the top mean, but its 95 % CI overlaps {', '.join(ex.tied)} (--point picks one)"
        )
    if d.adaptive:
        out.append(
            f"adaptive k: {len(schedule)} batch-size range(s) as num_speculative_tokens_per_batch_size"
            if schedule
            else "adaptive k: no per-batch-size choice other than k was measured; static num_speculative_tokens"
        )
    if d.online.enabled:
        out.append("the run adapted the drafter online; vLLM serves it fixed, as it started (final weights not kept)")
    cls = drafter_class(d.kind)
    out += cls.vllm_serving_notes(d) if cls else []
    if ex.head and cls and cls.vllm_head_folder:
        out.append(f"speculative_config.model is this machine's path {ex.head}: copy the folder and edit it")
    return out
