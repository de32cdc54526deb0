"""`wb report`'s Markdown tables: results (speedups with 95 % CIs, best or tie), stage times, and the
training signal with and without speculation.

Training signal: speculative decoding is exact, so the GRPO training signal must not depend on
the drafter. The FINISHED runs of the report are grouped by ``drafter.kind`` (pooled over seeds, k
and every other axis); each run gives its final reward (the last step's ``reward/mean``) and the
mean of its last 3 steps. Each speculative kind is compared with ``drafter.kind=none`` by Welch's
two-sample test (:func:`workbench.stats.two_sample`), read out with the smallest difference that
many runs could detect (alpha 0.05, power 0.8): "no difference detected" is only as strong as that.
"""

from __future__ import annotations

import math

from workbench import metrics as M
from workbench.report.target import Target, axis_value, label, row_mean, row_runs, short
from workbench.runs import RunRecord
from workbench.stats import PREDICTION_MIN_RUNS, RatioCI, two_sample
from workbench.sweep.results import INTERVAL_NOTE, REPEAT_KEY, Row, fmt_tau

STAGES = ("data", "prepare", "gen", "reward", "logprob", "train", "draft_train", "other")
REWARD = M.REWARD_MEAN
ALPHA, POWER, TAIL = 0.05, 0.8, 3

RESULTS_NOTE = (
    "acc.len / acc.rate / gen s / step s: means after warm-up (`measure.warmup_steps`, 1 by default), over the row's "
    "runs; gen× / step×: paired speedup (autoregressive s / speculative s of the same prompts in the same step), "
    f"geometric mean [95 % CI]; runs that differ only in `seed` are one row (n runs); the CI: {INTERVAL_NOTE}; "
    "`~`: unpaired run, its baseline run's s / its s (same setting only, no CI); reward: last step's `reward/mean`, "
    "mean over the row's runs; ★ best gen× only when its CI clears every other row's, ≈ tied for best."
)


def fmt_num(v: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def fmt_ci(ci: RatioCI | None, paired: bool = True) -> str:
    """``1.23× [1.10, 1.37]`` (paired, 95 % CI), ``1.23× (n=1)`` (paired, too few steps for a CI),
    ``~1.23×`` (unpaired), ``-``."""
    if ci is None:
        return "-"
    if not paired:
        return f"~{ci.mean:.2f}×"
    if ci.low is None or ci.high is None:
        return f"{ci.mean:.2f}× (n={ci.n})"
    return f"{ci.mean:.2f}× [{ci.low:.2f}, {ci.high:.2f}]"


def verdict(t: Target) -> str:
    """``best: X ...`` when decided, ``tie: A, B (95 % CIs overlap)`` otherwise; empty with no speedups."""
    dec = t.decision
    if dec.best:
        return f"**best: {dec.best}** (its 95 % CI clears every other point's)"
    if not dec.tied:
        return ""
    rows = {label(r): r for r in t.rows}
    unpaired = [n for n in dec.tied if not rows[n].paired]
    why = "95 % CIs overlap" + ("; `~` points have no CI" if unpaired else "")
    return f"**tie: {', '.join(dec.tied)}** ({why})"


def md_table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right or set()
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table_md(t: Target) -> str:
    """One line per row: drafter, axes, acc.len, acc.rate, gen s, step s, gen×, step× (95 % CI), reward, n, status,
    runs."""
    dec = t.decision
    axes = [a for a in t.axes if a not in ("drafter.kind", REPEAT_KEY)]
    header = [
        "drafter",
        *[short(a) for a in axes],
        "acc.len",
        "acc.rate",
        "gen s",
        "step s",
        "gen× [95 % CI]",
        "step× [95 % CI]",
        "τ",
        "reward",
        "n",
        "status",
        "runs",
    ]
    out = []
    for r in t.rows:
        run, name = r.point.run, label(r)
        mark = " ★" if name == dec.best else (" ≈" if name in dec.tied else "")
        finals = [v for x in row_runs(r) if (v := x.last(REWARD)) is not None]
        out.append(
            [
                run.kind,
                *[axis_value(run, a) for a in axes],
                fmt_num(row_mean(r, M.ACCEPTANCE_LENGTH), ".2f"),
                fmt_num(row_mean(r, M.ACCEPTANCE_RATE), ".2f"),
                fmt_num(row_mean(r, M.GEN_S)),
                fmt_num(row_mean(r, M.STEP_S)),
                fmt_ci(r.gen, r.paired) + mark,
                fmt_ci(r.step, r.paired),
                fmt_tau(r.gen_runs),
                fmt_num(sum(finals) / len(finals) if finals else None),
                str(len(r.ok)),
                ", ".join(sorted({x.status.lower() for x in row_runs(r, ok=False)})),
                " ".join(f"`{x.run_id[:8]}`" for x in row_runs(r, ok=False)),
            ]
        )
    table = md_table(header, out, right=set(range(1 + len(axes), 1 + len(axes) + 9)))
    v = verdict(t)
    repeats = repeat_lines(t)
    if repeats:
        v += ("\n\n" if v else "") + "\n".join(repeats)
    missing = [label(r) for r in t.rows if not r.point.is_baseline and r.gen is None and r.ok]
    if missing:
        v += ("\n\n" if v else "") + (
            f"No speedup for {', '.join(missing)}: not paired and no FINISHED `drafter.kind=none` "
            "run of the same setting (another setting's baseline is never used)."
        )
    return table + (f"\n\n{v}" if v else "")


def repeat_lines(t: Target) -> list[str]:
    """Per row with a random-effects estimate: its runs, τ, and where a new run's own estimate should
    fall (95 % prediction interval, Higgins et al. 2009), shown from PREDICTION_MIN_RUNS runs: below,
    t on n−2 df makes it too wide to tell a reader anything, and the line says so."""
    out = []
    for r in t.rows:
        re = r.gen_runs
        if re is None:
            continue
        pred = (
            f"a new run's gen× should read {re.pred_low:.2f}–{re.pred_high:.2f} (95 % prediction interval)"
            if re.pred_low is not None and re.n >= PREDICTION_MIN_RUNS
            else f"no prediction interval for a new run below {PREDICTION_MIN_RUNS} runs (with {re.n}, t on n−2 df "
            "makes it too wide to inform)"
        )
        out.append(f"- {label(r)}: {re.n} runs, between-run spread τ = {fmt_tau(re)}; {pred}.")
    return (["Repeats (gen×):", ""] + out) if out else []


# ----------------------------------------------------------------------------- stage times


def stage_rows(t: Target) -> tuple[list[Row], list[tuple[str, list[float | None]]]]:
    """Rows shown in the stage table (the top speculative row's baseline and itself; else up to 4
    rows with timings) and the table's (stage, seconds per shown row) lines, ``total`` last."""
    top = t.decision.best or t.decision.top
    best = next((r for r in t.rows if label(r) == top), None)
    bkey = best.ok[0].point.baseline_key if best is not None and best.ok else None
    base = next((r for r in t.rows if any(o.point.key == bkey for o in r.outcomes)), None) if bkey else None
    if best is not None and base is not None:
        shown = [base, best]
    else:
        shown = [r for r in t.rows if any(k.startswith(M.TIMING) for x in row_runs(r) for k in x.history)][:4]
    lines = [(s, [row_mean(r, M.timing(s)) for r in shown]) for s in STAGES]
    lines = [(s, v) for s, v in lines if any(x for x in v)]
    lines.append(("total", [row_mean(r, M.STEP_S) for r in shown]))
    return shown, lines


def stage_table_md(t: Target) -> str:
    shown, lines = stage_rows(t)
    header = ["stage", *[label(r) + " (s)" for r in shown]]
    pair = len(shown) == 2 and shown[0].point.is_baseline and not shown[1].point.is_baseline
    if pair:
        header.append("speedup")
    out = []
    for stage, vals in lines:
        row = [f"**{stage}**" if stage == "total" else stage, *[fmt_num(v) for v in vals]]
        if pair:
            spec = shown[1]
            paired = {"gen": spec.gen, "total": spec.step}.get(stage) if spec.paired else None
            a, b = vals
            row.append(fmt_ci(paired) if paired is not None else (f"~{a / b:.2f}×" if a and b else "-"))
        out.append(row)
    return md_table(header, out, right=set(range(1, len(header))))


# ----------------------------------------------------------------------------- training signal


BACKEND = "rollout.backend"


def _backend(r: RunRecord) -> str:
    return r.params.get(BACKEND, "workbench")


def reward_groups(t: Target) -> dict[str, list[RunRecord]]:
    """FINISHED runs with a ``reward/mean`` history by drafter kind (``none`` first, then by name).

    When the runs span several rollout backends (``rollout.backend=workbench,vllm``) the groups are
    ``kind (backend)``: a vLLM run's reward is compared with its own backend's autoregressive runs.
    """
    many = len({_backend(r) for r in t.runs}) > 1
    groups: dict[str, list[RunRecord]] = {}
    for r in t.runs:
        if r.status == "FINISHED" and r.history.get(REWARD):
            groups.setdefault(f"{r.kind} ({_backend(r)})" if many else r.kind, []).append(r)
    return dict(
        sorted(groups.items(), key=lambda kv: (_backend(kv[1][0]) != "workbench", kv[1][0].kind != "none", kv[0]))
    )


def _base_of(label: str) -> str:
    """The autoregressive group a group is tested against: ``none`` of the same backend."""
    return "none" + label[label.index(" (") :] if " (" in label else "none"


def _mean_sd(vals: list[float]) -> str:
    if not vals:
        return "-"
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return f"{m:.3f}"
    return f"{m:.3f} ± {math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)):.3f}"


def compare_rewards(kind: str, spec: list[float], base: list[float], sweep_spec: str, base_name: str = "none") -> str:
    """One plain-language line: the Welch test of final rewards ``kind`` vs ``base_name``, or the sweep to run."""
    what = kind.split(" (")[0] if base_name.startswith("none") else "none"
    fix = f"run `wb sweep {sweep_spec} drafter=none,{what} seed=0..4`"
    if len(spec) < 2 or len(base) < 2:
        return (
            f"- **{kind} vs {base_name}**: too few runs to test ({len(spec)} {kind}, {len(base)} {base_name}; a test "
            f"needs ≥ 2 per side): {fix}."
        )
    ts = two_sample(spec, base, ALPHA, POWER)
    n = f"n={ts.n_a}" if ts.n_a == ts.n_b else f"n={ts.n_a} ({kind}) and {ts.n_b} ({base_name})"
    if ts.p_value is not None and ts.p_value < ALPHA:
        return (
            f"- **{kind} vs {base_name}: difference detected** (p={ts.p_value:.3g}): {kind} − {base_name} = "
            f"{ts.diff:+.3f} final reward. Speculative decoding is exact and backends sample the same law, so this "
            "points at a bug (`wb audit`) or at runs that differ in more than the drafter or backend."
        )
    return (
        f"- **{kind} vs {base_name}**: no difference detected (p={ts.p_value:.2g}; {kind} − {base_name} = "
        f"{ts.diff:+.3f}); with {n} runs per side a difference of ≥ {ts.min_detectable:.3f} would have been detected "
        f"{POWER * 100:.0f} % of the time (alpha {ALPHA})."
    )


def training_signal_md(t: Target) -> list[str]:
    """The section's lines: rewards per drafter kind, and each speculative kind's test against none."""
    groups = reward_groups(t)
    sweep_spec = next((r.params["name"] for r in t.runs if r.params.get("name")), "quickstart")
    if not groups:
        return [f"_No FINISHED run with `{REWARD}`: run `wb sweep {sweep_spec} drafter=none,eagle3 seed=0..4`._"]
    rows = [
        [kind, str(len(rs)), _mean_sd([r.last(REWARD) for r in rs]), _mean_sd([r.tail_mean(REWARD, TAIL) for r in rs])]
        for kind, rs in groups.items()
    ]
    out = [
        md_table(["drafter", "runs", "final reward (mean ± sd)", f"last {TAIL} steps (mean ± sd)"], rows, {1, 2, 3}),
        "",
        "FINISHED runs grouped by `drafter.kind` (and `rollout.backend` where runs differ in it), pooled over seeds, k "
        f"and the other axes; final reward: the last step's `{REWARD}`. Welch two-sample test of the final rewards "
        "against `drafter.kind=none` of the same backend (and each backend's `none` against the workbench engine's):",
        "",
    ]
    final = {g: [r.last(REWARD) for r in rs] for g, rs in groups.items()}
    kinds = [g for g in groups if not g.startswith("none")]
    out += [compare_rewards(g, final[g], final.get(_base_of(g), []), sweep_spec, _base_of(g)) for g in kinds]
    # another backend's autoregressive runs against the workbench engine's: the backend changes no law
    others = [g for g in groups if g.startswith("none (") and g != "none (workbench)"]
    out += [
        compare_rewards(g, final[g], final.get("none (workbench)", []), sweep_spec, "none (workbench)") for g in others
    ]
    if not kinds and not others:
        out.append(f"- no speculative run to compare: run `wb sweep {sweep_spec} drafter=none,eagle3 seed=0..4`.")
    return out
