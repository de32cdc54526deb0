"""The GB200 write-up (``docs/results/simulate-gb200.md``) from its result JSON (``benchmarks/simulate-gb200.json``).

:func:`collect` runs what the write-up reports (the 8B scenario calibrated on RL-Zero k = 3 and, the
other way round, on RL-Think k = 3, :mod:`workbench.perf.simulate.validate`; the bound of a per-drafter-forward time;
the 235B projection at 512 / 2048 GPUs) into one JSON-able dict; :func:`render` turns that dict into
the write-up's generated sections (markdown tables), and :func:`apply` puts them between the
``<!-- BEGIN GENERATED name -->`` / ``<!-- END GENERATED name -->`` markers of the write-up, so the
numbers in the prose-free tables always come from the committed JSON (``benchmarks/simulate_gb200.py``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from workbench.perf.simulate.scenario import load_scenario
from workbench.perf.simulate.validate import Holdout, holdout

SCENARIO_8B = "qwen3-8b-gb200"
SCENARIO_235B = "qwen3-235b-gb200"
DIRECTIONS = (("RL-Zero", 3), ("RL-Think", 3))
GRID_235B = ["gpus=512,2048", "staleness=0,1", "k=3,5"]
# The alternative model: flops_efficiency measured (0.65: H100 bf16 matmuls of the 8B at 512-2048 tokens,
# benchmarks/verify-cost-h100.json) and the one fitted quantity a fixed time per drafter forward.
ALT = ["hardware.flops_efficiency=0.65", "calibration.unknown=draft_overhead_s"]
BOUND = ["hardware.flops_efficiency=1.0", "calibration.unknown=draft_overhead_s"]


def _compact(h: Holdout) -> dict[str, Any]:
    rows = [
        {
            "variant": r.variant,
            "k": r.result.k,
            "acceptance_length": r.result.acceptance_length,
            "gen_ar": r.result.gen_ar,
            "gen_spec": r.result.gen_spec,
            "step_ar": r.result.step_ar,
            "step_spec": r.result.step_spec,
            "gen_speedup_by_k": {str(k): v for k, v in r.result.gen_speedup_by_k.items()},
            "best_k": r.result.best_k,
        }
        for r in h.rows
    ]
    return {
        "calibrated_on": {"variant": h.variant, "k": h.k, "gen_s": h.fit.measured_gen_s},
        "fit": {"key": h.fit.key, "value": h.fit.value},
        "fixed": h.fixed,
        "table": h.table(),
        "rows": rows,
    }


def collect_8b(
    overrides: list[str] | None = None, needed: bool = True, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Both calibration directions of the 8B scenario, the alternative model, and (``needed``) the per-drafter-forward
    bound."""
    raw, base = load_scenario(SCENARIO_8B, overrides or [])
    out: dict[str, Any] = {"scenario": SCENARIO_8B, "overrides": overrides or [], "directions": {}}
    for variant, k in DIRECTIONS:
        progress(f"8B calibrated on {variant} k={k}")
        out["directions"][f"{variant} k={k}"] = _compact(holdout(raw, base, variant, k))
    out["alternative"] = {"overrides": ALT, "directions": {}}
    for variant, k in DIRECTIONS:
        progress(f"8B alternative model calibrated on {variant} k={k}")
        araw, abase = load_scenario(SCENARIO_8B, [*(overrides or []), *ALT])
        out["alternative"]["directions"][f"{variant} k={k}"] = _compact(holdout(araw, abase, variant, k))
    if needed:
        # the steepest k curve a fixed per-drafter-forward time can give while RL-Zero k = 3 holds: all of the
        # matmul time at peak (flops_efficiency 1), the rest of k = 3's time per drafter forward
        progress("8B bound: flops_efficiency 1.0, draft_overhead_s calibrated on RL-Zero k=3")
        braw, bbase = load_scenario(SCENARIO_8B, [*(overrides or []), *BOUND])
        out["bound"] = {"overrides": BOUND, **_compact(holdout(braw, bbase, *DIRECTIONS[0]))}
    return out


def collect_235b(progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The 235B projection on the 235B grid (nothing fitted to it; its flops_efficiency is the scenario's)."""
    from workbench.perf.simulate.run import run

    raw, base = load_scenario(SCENARIO_235B)
    progress("235B grid " + " ".join(GRID_235B))
    _, rows = run(raw, base, GRID_235B)
    return {
        "scenario": SCENARIO_235B,
        "grid": GRID_235B,
        "flops_efficiency": base.hardware.flops_efficiency,
        "rows": [
            {
                "gpus": r.result.gpus,
                "staleness": r.result.staleness,
                "k": r.result.k,
                "gen_speedup": r.result.gen_speedup,
                "step_speedup": r.result.step_speedup,
                "e2e_speedup": r.result.e2e_speedup,
                "reference": {n: {"predicted": p, "reference": v, "error": e} for n, (p, v, e) in r.errors.items()},
            }
            for r in rows
        ],
    }


def collect(progress: Callable[[str], None] = print) -> dict[str, Any]:
    return {"8b": collect_8b(progress=progress), "235b": collect_235b(progress)}


# ------------------------------------------------------------------ rendering


def _f(x: float, d: int = 2) -> str:
    return f"{x:.{d}f}"


def _holdout_table(d: dict[str, Any]) -> str:
    lines = ["| variant | quantity | k | predicted | published | error | role |", "|---|---|---|---|---|---|---|"]
    for r in d["table"]:
        lines.append(
            f"| {r['variant']} | {r['quantity']} | {r['k'] or 'AR'} | {_f(r['predicted'])} | {_f(r['published'])} | "
            f"{r['error']:+.1%} | {r['role']} |"
        )
    return "\n".join(lines)


def _cost_table(d: dict[str, Any]) -> str:
    lines = [
        "| variant | k | AL | speedup predicted / published | step cost predicted / published (AR steps) | missing "
        "per draft position |",
        "|---|---|---|---|---|---|",
    ]
    for r in d["table"]:
        if r["quantity"] != "gen_speedup":
            continue
        gap = (r["cost_published"] - r["cost_predicted"]) / r["k"]
        lines.append(
            f"| {r['variant']} | {r['k']} | {_f(r['acceptance_length'])} | {_f(r['predicted'])} / "
            f"{_f(r['published'])} | {_f(r['cost_predicted'])} / {_f(r['cost_published'])} | {gap:+.2f} |"
        )
    return "\n".join(lines)


def _fits(d: dict[str, Any]) -> str:
    lines = []
    for name, h in d["directions"].items():
        lines.append(
            f"- calibrated on **{name}** (gen {h['calibrated_on']['gen_s']:g} s): `{h['fit']['key']}` = "
            f"{h['fit']['value']:.4f}"
        )
    return "\n".join(lines)


def _235b_table(d: dict[str, Any]) -> str:
    """The 235B grid, each row against the paper's values for its own GPU count (``reference_by_gpus``)."""
    lines = [
        f"`hardware.flops_efficiency` = {d['flops_efficiency']:.3f}",
        "",
        "| GPUs | staleness | k | rollout × | sync step × | e2e × (vs sync AR) | rollout vs paper | e2e vs paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        ref = r.get("reference", {})
        err = [
            f"{_f(ref[n]['reference'])}×, {ref[n]['error']:+.0%}" if n in ref else "–"
            for n in ("rollout_speedup", "e2e_speedup")
        ]
        lines.append(
            f"| {r['gpus']} | {r['staleness']} | {r['k']} | {_f(r['gen_speedup'])} | {_f(r['step_speedup'])} | "
            f"{_f(r['e2e_speedup'])} | {err[0]} | {err[1]} |"
        )
    return "\n".join(lines)


def render(data: dict[str, Any]) -> dict[str, str]:
    """{section name: markdown} for :func:`apply` (module doc)."""
    d8 = data["8b"]
    out = {"8b-fits": _fits(d8)}
    for i, (name, h) in enumerate(d8["directions"].items()):
        tag = "a" if i == 0 else "b"
        out[f"8b-holdout-{tag}"] = _holdout_table(h)
        out[f"8b-cost-{tag}"] = _cost_table(h)
    for i, (name, h) in enumerate(d8.get("alternative", {}).get("directions", {}).items()):
        tag = "a" if i == 0 else "b"
        out[f"8b-alt-{tag}"] = (
            f"`{h['fit']['key']}` = {h['fit']['value'] * 1e3:.3f} ms fitted on {name}\n\n" + _holdout_table(h)
        )
    if "bound" in d8:
        b = d8["bound"]
        out["8b-bound"] = (
            f"`{b['fit']['key']}` = {b['fit']['value'] * 1e3:.3f} ms per drafter forward with "
            f"`hardware.flops_efficiency` = 1.0, calibrated on {b['calibrated_on']['variant']} k = "
            f"{b['calibrated_on']['k']}\n\n" + _holdout_table(b)
        )
    out["235b"] = _235b_table(data["235b"])
    return out


_MARK = re.compile(
    r"(<!-- BEGIN GENERATED (?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n?<!-- END GENERATED (?P=name) -->)", re.S
)


def apply(text: str, sections: dict[str, str]) -> str:
    """``text`` with each marked section's body replaced by ``sections[name]``.

    Raises:
        ValueError: a marker names a section ``sections`` lacks, or a section has no marker.
    """
    seen: set[str] = set()

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in sections:
            raise ValueError(
                f"write-up marker {name!r} has no generated section; sections: {', '.join(sorted(sections))}"
            )
        seen.add(name)
        return f"{m.group(1)}{sections[name]}\n<!-- END GENERATED {name} -->"

    out = _MARK.sub(sub, text)
    missing = set(sections) - seen
    if missing:
        raise ValueError(f"sections without a marker in the write-up: {', '.join(sorted(missing))}")
    return out
