"""`wb project`'s Rich output: one function per mode, results in, tables out (no computing here)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from workbench.perf.analytic import Projection
from workbench.perf.calibrate import Calibration
from workbench.perf.seeds import GEN_FRACTION_RANGE, LOGPROB_TRAIN_RANGE, SeedCheck
from workbench.rollout.cost import expected_tokens, knee_verify_ratio


def projection(
    console: Console,
    stages: dict[str, float],
    cost_desc: str,
    batch: int,
    rows: list[Projection],
    best: dict[str, Projection],
    overlap: list[tuple[int, float, dict[str, float]]],
    cv: float,
    async_sides: tuple[float, float, str] | None = None,
) -> None:
    """The synchronous table (every drafter × k, * = best k), the async table (per staleness; its gen
    and train side from ``async_sides`` (gen s, train side s, where) when given) and the best k."""
    step = sum(stages.values())
    console.print(
        f"step {step:.2f} s = "
        + " + ".join(f"{k} {v:.2f}" for k, v in stages.items() if v)
        + f"; cost model: {cost_desc}; batch {batch}",
        highlight=False,
    )
    t = Table(title="synchronous step: projected speedups (Leviathan, S = E[N] / (k·c + verify))")
    for col in ("drafter", "k", "α", "c", "E[N]", "verify/step", "gen ×", "gen s", "step s", "step ×"):
        t.add_column(col)
    for r in rows:
        mark = " *" if best[r.drafter] is r else ""
        t.add_row(
            r.drafter,
            f"{r.k}{mark}",
            f"{r.alpha:.3f}",
            f"{r.c:.3g}",
            f"{r.expected_tokens:.2f}",
            f"{r.verify_ratio:.2f}",
            f"{r.gen_speedup:.2f}",
            f"{r.gen_s:.2f}",
            f"{r.step_s:.2f}",
            f"{r.step_speedup:.2f}",
        )
    console.print(t)
    gen_a, train_side, where = async_sides or (stages["gen"], step - stages["gen"], "a device per side")
    a = Table(
        title=f"asynchronous overlap ({where}: gen {gen_a:.2f} s ‖ train side {train_side:.2f} s, gen cv {cv}): "
        f"mean step s (× vs sync autoregressive {step:.2f} s)"
    )
    a.add_column("staleness")
    a.add_column("autoregressive")
    for d, r in best.items():
        a.add_column(f"{d} k={r.k}")
    for s, ar, spec in overlap:
        a.add_row("0 (sync)" if s == 0 else str(s), *(f"{v:.2f} ({step / v:.2f}×)" for v in (ar, *spec.values())))
    console.print(a)
    console.print(
        "best k: "
        + ", ".join(f"{d} k={r.k} (gen {r.gen_speedup:.2f}×, step {r.step_speedup:.2f}×)" for d, r in best.items()),
        highlight=False,
    )


def seeds(console: Console, checks: list[SeedCheck], tolerance: float) -> None:
    """Per seed: published stage times, the model's projected vs the published step speedup, the
    checks, and what the data say that the model does not."""
    pct = lambda lo_hi: f"{lo_hi[0]:.0%}–{lo_hi[1]:.0%}"  # noqa: E731
    mark = lambda ok: "[green]✓[/]" if ok else "[red]✗[/]"  # noqa: E731
    t = Table(
        title="docs/design.md §6 seeds: step speedup projected from the published stage times vs published "
        f"(tolerance ±{tolerance:.0%})",
        caption="projected step × = step / (step − gen + gen/S), step = Σ autoregressive stages, S = gen / "
        "speculative gen: speculation changes gen only (docs/design.md §3)",
    )
    t.add_column("quantity")
    for c in checks:
        t.add_column(c.name, justify="right")
    stages = list(dict.fromkeys(k for c in checks for k in c.seed.autoregressive))
    rows = [
        (
            f"{st} s (autoregressive → speculative)",
            lambda c, st=st: f"{c.seed.autoregressive[st]:.1f} → {c.seed.speculative[st]:.1f}",
        )
        for st in stages
    ]
    rows += [
        (
            "Σ stages s (published total)",
            lambda c: (
                f"{c.step:.1f} ({c.seed.totals[0]:.1f}) → {c.step_spec:.1f} ({c.seed.totals[1]:.1f}) "
                f"{mark(c.checks['totals'])}"
            ),
        ),
        (
            f"gen fraction (§6: {pct(GEN_FRACTION_RANGE)})",
            lambda c: f"{c.gen_fraction:.1%} {mark(c.checks['gen fraction'])}",
        ),
        (
            f"logprob + train fraction (§6: {pct(LOGPROB_TRAIN_RANGE)})",
            lambda c: f"{c.logprob_train_fraction:.1%} {mark(c.checks['logprob+train fraction'])}",
        ),
        (
            "gen speedup S from the times (published)",
            lambda c: f"{c.gen_speedup:.3f} ({c.seed.gen_speedup:g}) {mark(c.checks['gen speedup'])}",
        ),
        ("non-gen s (model: unchanged)", lambda c: f"{c.non_gen[0]:.1f} → {c.non_gen[1]:.1f}"),
        ("projected step speedup", lambda c: f"{c.projected:.3f}"),
        ("published step speedup", lambda c: f"{c.seed.step_speedup:.2f}"),
        ("error", lambda c: f"{c.error:+.1%}"),
        ("pass", lambda c: "[green]✓ pass[/]" if c.ok else "[red]✗ FAIL[/]"),
    ]
    for label, fn in rows:
        t.add_row(label, *(fn(c) for c in checks))
    console.print(t)
    for c in checks:
        drift = ", ".join(f"{k} {v:+.1f}" for k, v in c.drift().items())
        console.print(
            f"{c.name}: the model keeps the non-gen stages; the data move them by {drift} s "
            f"(net {c.non_gen[1] - c.non_gen[0]:+.1f} s, {(c.non_gen[1] - c.non_gen[0]) / c.step_spec:+.1%} of the "
            "speculative step)",
            highlight=False,
        )


def calibration(console: Console, cal: Calibration, alpha_how: str) -> None:
    """The calibration as a Rich table, the fitted parameter and the assumptions."""
    knee_s = "∞ (memory-bound)" if math.isinf(cal.knee) else f"{cal.knee:.1f} tokens"
    fitted = f"c = {cal.c:.4g} (drafter step / target step)" if cal.unknown == "c" else f"T_knee = {knee_s}"
    given = f"T_knee = {knee_s}" if cal.unknown == "c" else f"c = {cal.c:g}"
    console.print(f"fitted {fitted}; given {given}, batch {cal.batch} rows, α = {cal.alpha:.4f}", highlight=False)
    t = Table(
        title="predicted gen speedup per k",
        caption="S = E[N] / (k·c + v), E[N] = (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023), "
        "v = max(1, B·(k+1)/T_knee) / max(1, B/T_knee); * best k, ← the measured point",
    )
    for col in ("k", "E[N]", "k·c", "verify v", "gen × (predicted)"):
        t.add_column(col, justify="right")
    best = cal.best_k
    for k, s in cal.predictions.items():
        mark = (" *" if k == best else "") + (" ←" if k == cal.k else "")
        t.add_row(
            f"{k}{mark}",
            f"{expected_tokens(cal.alpha, k):.3f}",
            f"{k * cal.c:.3f}",
            f"{knee_verify_ratio(k, cal.batch, cal.knee):.3f}",
            f"{s:.3f}",
        )
    console.print(t)
    console.print(
        f"measured: gen × {cal.speedup:g} at k={cal.k} (reproduced: {cal.predictions[cal.k]:.3f}); α {alpha_how}; "
        f"best k = {best} (gen × {cal.predictions[best]:.3f})",
        highlight=False,
    )
    console.print(
        "assumes: per-position acceptance α^(i+1) (independent positions), α and c the same at every k, "
        "the batch stays full (no long tail), verification cost from the knee roofline; sampling, rejection "
        "and bookkeeping free",
        highlight=False,
    )
