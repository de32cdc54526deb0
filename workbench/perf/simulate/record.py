"""The MLflow record of a ``wb simulate`` run: inputs as params, predictions as metrics, JSON and plot as artifacts.

One MLflow run per ``wb simulate`` call, through :class:`workbench.tracking.Tracker` (the store
``wb run`` uses: ``--tracking-uri``, else $MLFLOW_TRACKING_URI, else ``sqlite:///mlflow.db``), in
its own experiment (``simulate`` by default) and tagged ``workbench.simulate=true`` with the kind
(``scenario`` or ``sweep-check``), so sweep tables, reports and studies, which read runs tagged
``workbench.sweep`` / ``workbench.study``, never list it. A run that raises is marked FAILED with
the error in the tag ``workbench.simulate.error`` (:func:`simulate_run`).

- scenario: params = the scenario's resolved fields flattened (dotted keys, variants included) +
  the sweep arguments and the calibrated unknown; metrics per grid row, the row's index as the
  step (``simulate/gen_speedup``, ``simulate/gen_ar_s``, ...; ``points.json`` maps index -> variant
  and point);
- sweep check (``--from-sweep``): params = the sweep, store read, calibration k, unknown, workload and
  hardware provenance; metrics per point (``cpu/measured``, ``cpu/ci95_low``, ``cpu/predicted``,
  ``cpu/error``, ``cpu/inside``, ``cpu/k``, ``cpu/runs`` and, over ≥ 2 runs, ``cpu/tau``), the fitted unknown per
  drafter (``cpu/fit_s/<kind>``)
  and ``cpu/inside_count`` / ``cpu/predicted_count``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.tracking import Tracker

TAG = "workbench.simulate"  # "true" on every wb simulate run
TAG_KIND = "workbench.simulate.kind"  # scenario | sweep-check
TAG_ERROR = "workbench.simulate.error"  # what a FAILED run raised
DEFAULT_EXPERIMENT = "simulate"
# StepResult.record() field -> metric name under simulate/ (seconds per GRPO step: _s)
ROW_METRICS = {
    "k": "k",
    "gpus": "gpus",
    "staleness": "staleness",
    "acceptance_length": "acceptance_length",
    "gen_ar": "gen_ar_s",
    "gen_spec": "gen_spec_s",
    "step_ar": "step_ar_s",
    "step_spec": "step_spec_s",
    "gen_speedup": "gen_speedup",
    "step_speedup": "step_speedup",
    "e2e_speedup": "e2e_speedup",
    "best_k": "best_k",
}


@contextmanager
def simulate_run(
    tracking_uri: str | None, experiment: str, run_name: str | None, enabled: bool, kind: str
) -> Iterator[Tracker]:
    """An open MLflow run for one ``wb simulate`` (a no-op Tracker when ``enabled`` is False); FINISHED
    on exit, FAILED (error tagged) when the body raises, KILLED on Ctrl-C."""
    tr = Tracker(tracking_uri, experiment, run_name=run_name, enabled=enabled, tags={TAG: "true", TAG_KIND: kind})
    with tr:
        try:
            yield tr
        except Exception as e:
            tr.set_tags({TAG_ERROR: f"{type(e).__name__}: {e}"[:4000]})
            raise


def scenario_metrics(rows: list[Any]) -> list[dict[str, float]]:
    """Per grid row (:class:`workbench.perf.simulate.run.Row`) its ``simulate/<quantity>`` metrics (seconds
    per GRPO step ``_s``, speedups ×) and its errors against the reference (``simulate/error/<name>``)."""
    out = []
    for r in rows:
        rec = r.result.record()
        m = {
            f"simulate/{name}": rec[key] for key, name in ROW_METRICS.items() if isinstance(rec.get(key), (int, float))
        }
        m.update({f"simulate/error/{n}": e for n, (_, _, e) in r.errors.items()})
        out.append(m)
    return out


def log_scenario(
    tr: Tracker, raw: dict, overrides: list[str], axes: list[str], fit: Any, rows: list[Any], record: dict
) -> None:
    """Params, per-row metrics and the JSON record of a scenario run (module doc)."""
    tr.log_params({**raw, "simulate": {"overrides": " ".join(overrides) or "-", "sweep": " ".join(axes) or "-"}})
    if fit is not None:
        tr.log_params({"calibration.fitted_key": fit.key})
        tr.log_metrics({"simulate/calibrated_value": fit.value}, step=0)
    for i, m in enumerate(scenario_metrics(rows)):
        tr.log_metrics(m, step=i)
    tr.log_dict({str(i): {"variant": r.variant, "point": r.point} for i, r in enumerate(rows)}, "points.json")
    tr.log_dict(record, "simulate.json")


def log_sweep_check(tr: Tracker, chk: Any, source_uri: str) -> None:
    """Params, per-point metrics and the JSON record of a sweep check
    (:class:`workbench.perf.simulate.cpu.CpuCheck`)."""
    rec = chk.record()
    tr.log_params(
        {
            "from_sweep": chk.sweep,
            "from_tracking_uri": source_uri,
            "calibrate_k": chk.calibrate_k,
            "unknown": chk.unknown,
            "workload": rec["workload"],
            "hardware": {k: v for k, v in rec["hardware"].items() if k != "curves"},
        }
    )
    for kind, x in chk.fits.items():
        tr.log_metrics({f"cpu/fit_s/{kind}": x}, step=0)
    tr.log_metrics({"cpu/inside_count": rec["inside"], "cpu/predicted_count": rec["predicted"]}, step=0)
    for i, r in enumerate(chk.rows):
        tr.log_metrics(
            {
                "cpu/k": r.k,
                "cpu/measured": r.measured,
                "cpu/ci95_low": r.low,
                "cpu/ci95_high": r.high,
                "cpu/predicted": r.predicted,
                "cpu/error": r.error,
                "cpu/miss": r.miss,
                "cpu/inside": float(r.inside),
                "cpu/calibration": float(r.calibration),
                "cpu/gen_ar_s": r.gen_ar_s,
                "cpu/gen_spec_s": r.gen_spec_s,
                "cpu/runs": r.runs,
                **({"cpu/tau": r.tau} if r.tau is not None else {}),
            },
            step=i,
        )
    tr.log_dict({str(i): f"{r.kind} k={r.k}" for i, r in enumerate(chk.rows)}, "points.json")
    tr.log_dict(rec, "simulate.json")
