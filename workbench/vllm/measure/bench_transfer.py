"""`wb bench --vllm KIND`'s transfer columns: vLLM's speculative speedup
predicted from the workbench engine's acceptance and vLLM's cost curve, measured apart from the
task's acceptance, beside vLLM's own paired measurement.

The cost runs (two more contenders in :func:`workbench.vllm.measure.bench.run_vllm`'s rotation, so load
drifting on a shared machine hits them as it hits the measured arms): vLLM's plain and speculative
engines, greedy, on *cost prompts* (:func:`cost_prompts`: the task prompts' lengths, so prefills
cost the same, and their tokens made periodic, so n-gram lookup matches at most steps), each engine
step timed (:func:`timed_steps`). Per repeat they give t_v(b,0), t_v(b,k) (only steps in which every
row drafted k tokens) and the fixed seconds around the steps
(:func:`workbench.vllm.measure.transfer.step_costs`); with the workbench engine's counters of the task's
greedy generation they give one predicted speedup per repeat; the row carries their geometric
mean and 95 % CI (the maths and its assumptions: :mod:`workbench.vllm.measure.transfer`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from workbench.timing import barrier
from workbench.vllm.measure.transfer import (
    VLLMCosts,
    draft_shares,
    fitted_step_cost,
    inside,
    per_row_speedup,
    predicted_speedup,
    prediction_ci,
    step_costs,
    tokens_per_row_step,
)

COST_NAMES = ("vllm_ar_cost", "vllm_spec_cost")  # the cost runs' contender names in run_vllm


def cost_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """One cost prompt per prompt, as long as it: its first token (BOS), then the first half of the
    rest repeated. Same lengths, so vLLM's prefill and KV cache cost what the task's do; periodic,
    so the suffix of the context recurs earlier and n-gram lookup drafts at most steps (the cost
    of a step where every row drafted k is what is read off them). Prompts of <= 2 tokens are kept."""
    out = []
    for p in prompts:
        body = list(p[1 : 1 + max((len(p) - 1) // 2, 1)])
        if len(p) <= 2:
            out.append(list(p))
            continue
        reps = list(p[:1]) + body * (len(p) // len(body) + 1)
        out.append(reps[: len(p)])
    return out


@dataclass
class StepRun:
    """One timed vLLM generation: wall seconds, and per engine step (the prefill first) its
    seconds, rows and draft tokens verified; ``out``: the ``RolloutOutput``."""

    wall_s: float
    step_s: list[float]
    rows: list[int]
    draft_tokens: list[int]
    out: object


def timed_steps(backend, prompts: list[list[int]], sampling, device=None) -> StepRun:
    """Generate ``prompts`` with ``backend`` (``generate_steps``: a generator yielding after every
    engine step), timing each step with ``time.perf_counter``; ``device`` is synchronised before
    and after (vLLM returns host outputs from each step, so its steps are synchronous)."""
    sync = barrier(device)
    sync()
    gen = backend.generate_steps(prompts, sampling)
    steps: list[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        try:
            next(gen)
        except StopIteration as stop:
            out = stop.value
            break
        steps.append(time.perf_counter() - t0)
    sync()
    wall = time.perf_counter() - t_start
    c = out.counters
    return StepRun(wall, steps, list(c.rows_per_forward), list(c.draft_tokens_per_step or [0] * len(steps)), out)


def repeat_costs(plain: StepRun, spec: StepRun, k: int) -> tuple[VLLMCosts | None, int]:
    """vLLM's costs from one repeat's plain and speculative cost runs, and how many speculative
    steps had every row drafting k. Where none had, t_v(b,k) is fitted on the steps' draft counts
    (:func:`workbench.vllm.measure.transfer.fitted_step_cost`; 0 steps used says so); None when that
    fails too (t_v(b,k) unmeasured in this repeat)."""
    t0, f0, _ = step_costs(plain.step_s, plain.rows, None, 0, plain.wall_s)
    tk, fk, used = step_costs(spec.step_s, spec.rows, spec.draft_tokens, k, spec.wall_s)
    if tk is None:
        tk = fitted_step_cost(spec.step_s, spec.rows, spec.draft_tokens, k)
    if t0 is None or tk is None:
        return None, used
    return VLLMCosts(t0, {k: tk}, f0, fk), used


def _ci(values: list[float]) -> dict | None:
    if not values:
        return None
    ci = prediction_ci(values)
    return {"mean": ci.mean, "lo": ci.low, "hi": ci.high}


def _shares(counters) -> list[float]:
    return draft_shares(
        counters.rows_per_forward, counters.k_per_step, counters.draft_tokens_per_step, counters.num_draft_tokens
    )


def _costs(k: int, cost_runs: list[tuple[StepRun, StepRun]]) -> tuple[list[VLLMCosts], list[int]]:
    """The repeats' :class:`VLLMCosts` (those with t_v(b,k) measured) and each repeat's full-step count."""
    costs, used = [], []
    for plain, spec in cost_runs:
        c, n_used = repeat_costs(plain, spec, k)
        used.append(n_used)
        if c is not None:
            costs.append(c)
    return costs, used


def predict_setting(k: int, cost_runs: list[tuple[StepRun, StepRun]], counters, ours_ar) -> dict:
    """vLLM's speedup predicted for a setting vLLM cannot run (``suffix``, adaptive k), from our
    engine's counters of that setting's run (``counters``; ``ours_ar``: our plain run of the same
    prompts, for its step count) and the cost runs of the drafter vLLM ran at ``k``
    (its proxy; a step at k_t < k priced by :meth:`workbench.vllm.measure.transfer.VLLMCosts.step_s`).

    Returns ``vllm_predicted_speedup`` {mean, lo, hi} (None without a usable repeat or decode step)
    and the inputs: tokens per row-step, steps, undrafted steps, the k_t used.
    """
    if not counters.rows_per_forward or ours_ar.num_verify_steps < 1:
        return {"vllm_predicted_speedup": None, "note": "no decode steps to price (max_new_tokens < 2)"}
    shares = _shares(counters)
    costs, _ = _costs(k, cost_runs)
    pred = [predicted_speedup(ours_ar.num_verify_steps, counters.k_per_step, shares, c) for c in costs]
    return {
        "vllm_predicted_speedup": _ci(pred),
        "repeats_used": len(costs),
        "ours_tokens_per_row_step": tokens_per_row_step(counters.num_accepted_tokens, sum(counters.rows_per_forward)),
        "ours_spec_steps": counters.num_verify_steps,
        "ours_undrafted_steps": sum(1 for f in shares if f == 0),
        "k_used": sorted(set(counters.k_per_step)),
    }


def transfer_row(
    k: int, cost_runs: list[tuple[StepRun, StepRun]], ours_spec, ours_ar, vllm_spec, vllm_ar, measured: dict
) -> dict:
    """The row keys of the transfer prediction at one batch size.

    k: num_speculative_tokens. cost_runs: (plain, speculative) :class:`StepRun` per repeat.
    ours_spec / ours_ar: the workbench engine's ``SpecCounters`` of the task's greedy speculative /
    plain generation (steps after the prefill); vllm_spec / vllm_ar: vLLM's (its first step is the
    prefill), used only for the control prediction from vLLM's own acceptance. measured: the row's
    ``vllm_spec_speedup`` {mean, lo, hi}.

    Keys: ``vllm_predicted_speedup`` {mean, lo, hi} (the step model from our counters: the
    prediction), ``vllm_predicted_in_ci`` (its mean inside the measured CI), ``vllm_predicted_ci_overlap``,
    ``vllm_predicted_speedup_per_row`` (the per-row formula), ``vllm_predicted_from_vllm_acceptance``
    (the step model from vLLM's own counters: the cost model's error without the transfer's), and
    ``transfer`` (the inputs: median costs in ms, steps, repeats used).
    """
    if (
        not ours_spec.rows_per_forward
        or ours_ar.num_verify_steps < 1
        or any(len(r.step_s) < 2 for run in cost_runs for r in run)
    ):
        # max_new_tokens = 1: the prefill emits every token, there is no decode step to price
        none = dict.fromkeys(
            (
                "vllm_predicted_speedup",
                "vllm_predicted_in_ci",
                "vllm_predicted_ci_overlap",
                "vllm_predicted_speedup_per_row",
                "vllm_predicted_from_vllm_acceptance",
            )
        )
        return none | {"transfer": {"note": "no decode steps to price (max_new_tokens < 2)"}}
    shares = _shares(ours_spec)
    tau = tokens_per_row_step(ours_spec.num_accepted_tokens, sum(ours_spec.rows_per_forward))
    v_rows, v_k, v_drafts = (
        vllm_spec.rows_per_forward[1:],
        vllm_spec.k_per_step[1:],
        (vllm_spec.draft_tokens_per_step or [])[1:],
    )
    v_shares = draft_shares(v_rows, v_k, v_drafts, vllm_spec.num_draft_tokens) if v_rows else None
    costs, used = _costs(k, cost_runs)
    pred, per_row, control = [], [], []
    for c in costs:
        pred.append(predicted_speedup(ours_ar.num_verify_steps, ours_spec.k_per_step, shares, c))
        per_row.append(per_row_speedup(tau, c.plain_step_s, c.spec_step_s[k]))
        if v_shares is not None and vllm_ar.num_verify_steps > 1:
            control.append(predicted_speedup(vllm_ar.num_verify_steps - 1, v_k, v_shares, c))
    p = _ci(pred)
    med = (lambda f: 1e3 * statistics.median(f(c) for c in costs)) if costs else (lambda f: None)
    return {
        "vllm_predicted_speedup": p,
        "vllm_predicted_in_ci": inside(p and p["mean"], measured.get("lo"), measured.get("hi")),
        "vllm_predicted_ci_overlap": None
        if p is None or p["lo"] is None or measured.get("lo") is None
        else not (p["lo"] > measured["hi"] or measured["lo"] > p["hi"]),
        "vllm_predicted_speedup_per_row": _ci(per_row),
        "vllm_predicted_from_vllm_acceptance": _ci(control),
        "transfer": {
            "plain_step_ms": med(lambda c: c.plain_step_s),
            "spec_step_ms": med(lambda c: c.spec_step_s[k]),
            "plain_fixed_ms": med(lambda c: c.plain_fixed_s),
            "spec_fixed_ms": med(lambda c: c.spec_fixed_s),
            "repeats_used": len(costs),
            "repeats": len(cost_runs),
            "full_steps_min": min(used, default=0),
            "ours_tokens_per_row_step": tau,
            "ours_spec_steps": ours_spec.num_verify_steps,
            "vllm_spec_steps": max(vllm_spec.num_verify_steps - 1, 0),
            "plain_steps": ours_ar.num_verify_steps,
            "ours_undrafted_steps": sum(1 for f in shares if f == 0),
        },
    }


def _ci_text(x: dict | None) -> str:
    return (
        f"{x['mean']:.2f}× [{x['lo']:.2f}, {x['hi']:.2f}]"
        if x and x.get("lo") is not None
        else (f"{x['mean']:.2f}×" if x else "-")
    )


def _f(x, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def transfer_markdown(rows: list[dict]) -> list[str]:
    """The transfer table's Markdown lines ([] when no row carries a prediction: results written
    before it, or ``--no-transfer``)."""
    rows = [x for x in rows if "vllm_predicted_speedup" in x]
    if not rows:
        return []
    lines = [
        "",
        "### Transfer: vLLM's speedup predicted from our engine's acceptance",
        "",
        "Predicted = (F_plain + S_plain·t_v(b,0)) / (F_spec + Σ_s t(s)) over our engine's greedy steps, t(s) = "
        "t_v(b,0) + (t_v(b,k) − t_v(b,0))·(share of the step's draft slots used); t_v and F (seconds outside the "
        "decode steps) from vLLM's cost runs on periodic prompts of the task's lengths, interleaved with the measured "
        "arms (full steps 0: t_v(b,k) "
        "fitted on the steps' draft counts, no step having every row drafting k); geometric mean and 95 % CI "
        "over the repeats (workbench.vllm.measure.transfer). Per-row: tokens per row-step × t_v(b,0) / t_v(b,k). "
        "From vLLM's acceptance: the same model with vLLM's own step counts (the cost model's error alone).",
        "",
        "| batch | vLLM measured | predicted | inside CI | per-row formula | from vLLM's acceptance | steps ours / "
        "vLLM | t_v(b,0) ms | t_v(b,k) ms | F plain / spec ms | full steps (min) | repeats used |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        t = x.get("transfer") or {}
        lines.append(
            f"| {x['batch']} | {_ci_text(x.get('vllm_spec_speedup'))} | {_ci_text(x['vllm_predicted_speedup'])} | "
            f"{'-' if x.get('vllm_predicted_in_ci') is None else ('yes' if x['vllm_predicted_in_ci'] else 'no')} | "
            f"{_ci_text(x.get('vllm_predicted_speedup_per_row'))} | "
            f"{_ci_text(x.get('vllm_predicted_from_vllm_acceptance'))} | "
            f"{t.get('ours_spec_steps', '-')} / {t.get('vllm_spec_steps', '-')} | {_f(t.get('plain_step_ms'), 2)} | "
            f"{_f(t.get('spec_step_ms'), 2)} | {_f(t.get('plain_fixed_ms'))} / {_f(t.get('spec_fixed_ms'))} | "
            f"{t.get('full_steps_min', '-')} | {t.get('repeats_used', '-')}/{t.get('repeats', '-')} |"
        )
    return lines


def predictions_markdown(rows: list[dict]) -> list[str]:
    """The table of vLLM-predicted speedups for settings vLLM cannot run ([] when none was asked for)."""
    items = [(x["batch"], p) for x in rows for p in x.get("vllm_predicted_for", [])]
    if not items:
        return []
    lines = [
        "",
        "### vLLM's speedup predicted for settings vLLM cannot run",
        "",
        "Our engine runs each setting as GRPO rolls out (the batch as groups of grpo.group_size siblings, the spec's "
        "sampling, in the rotation; suffix drafts from its own and its siblings' tokens only); its speedup over our "
        "plain decoding of the same groups is paired per repeat; vLLM's is predicted from that run's steps and the "
        "cost runs above (the proxy: vLLM's drafter at the spec's k; a step at k_t < k priced affine in its draft "
        "tokens). Unvalidated by construction: vLLM cannot run these.",
        "",
        "| batch | setting | ours measured speedup | acc. length | tokens / row-step | vLLM predicted | steps | "
        "undrafted steps | k_t used | cost proxy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b, p in items:
        lines.append(
            f"| {b} | {p['setting']} | {_ci_text(p.get('ours_spec_speedup'))} | {_f(p.get('acceptance_length'), 2)} | "
            f"{_f(p.get('ours_tokens_per_row_step'), 2)} | {_ci_text(p.get('vllm_predicted_speedup'))} | "
            f"{p.get('ours_spec_steps', '-')} | {p.get('ours_undrafted_steps', '-')} | "
            f"{','.join(map(str, p.get('k_used', []))) or '-'} | {p.get('proxy', '-')} |"
        )
    return lines
