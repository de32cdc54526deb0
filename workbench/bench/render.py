"""Results of ``wb bench`` as files: ``<name>.json`` (every number and the command), ``<name>.md``
(the tables), and the one-page summary of several results that ``benchmarks/gpu.sh`` writes
(:func:`summary_markdown`, with the GPU targets checked against the numbers)."""

from __future__ import annotations

import json
from pathlib import Path

# The GPU targets, read in bf16: our autoregressive engine against transformers' best
# generate() at this batch, and eagle3's best k against our autoregressive engine.
GOAL_AR_BATCH, GOAL_AR_RATIO, GOAL_EAGLE3_SPEEDUP = 64, 1.5, 1.5


def save(results: dict, out_dir: Path, command: str, name: str) -> tuple[Path, Path]:
    """Write ``<name>.json`` (all numbers + the command) and ``<name>.md`` (tables) under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = results | {"command": command}
    jpath = out_dir / f"{name}.json"
    jpath.write_text(json.dumps(results, indent=2, default=str))
    mpath = out_dir / f"{name}.md"
    mpath.write_text(to_markdown(results))
    return jpath, mpath


def _f(x, nd=2) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def _ci(x: dict) -> str:
    """A bench row's paired speedup "1.23 [1.20, 1.26]" (results written before it had one: -)."""
    if x.get("speedup_mean") is None:
        return "-"
    return f"{x['speedup_mean']:.2f} [{_f(x.get('speedup_ci95_low'))}, {_f(x.get('speedup_ci95_high'))}]"


def _has_peaks(r: dict) -> bool:
    return any(x.get("ours_peak_mib") is not None for x in r.get("ar", []))


def _ar_table(r: dict) -> list[str]:
    peaks = _has_peaks(r)
    settings = sorted({x["hf_static_setting"] for x in r.get("ar", []) if x.get("hf_static_setting")})
    lines = [
        "## Autoregressive: ours vs transformers generate()",
        "",
        "transformers twice: plain `generate()` (dynamic cache) and its strongest documented settings ("
        + (", ".join(settings) or "static cache: failed, see below")
        + "); ours / best transformers = speed ratio to the faster of the two.",
        "",
    ]
    head = "| batch | ours tok/s | generate() tok/s | static tok/s | ours / best transformers | ours / generate() |"
    if peaks:
        head += " ours peak MiB | generate() peak MiB | static peak MiB |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    errors = []
    for x in r.get("ar", []):
        line = (
            f"| {x['batch']} | {_f(x['ours_tok_s'], 0)} | {_f(x.get('hf_generate_tok_s'), 0)} | "
            f"{_f(x.get('hf_static_tok_s'), 0)} | "
            f"{_f(x.get('ratio'))} | {_f(x.get('ratio_generate'))} |"
        )
        if peaks:
            line += (
                f" {_f(x.get('ours_peak_mib'), 0)} | {_f(x.get('hf_generate_peak_mib'), 0)} | "
                f"{_f(x.get('hf_static_peak_mib'), 0)} |"
            )
        lines.append(line)
        errors += [f"- batch {x['batch']}, {name}: `{e}`" for name, e in (x.get("hf_errors") or {}).items()]
    if errors:
        lines += ["", "transformers settings that raised (recorded, not timed):", *errors]
    return lines


def to_markdown(r: dict) -> str:
    """The tables of one ``wb bench`` result (the JSON's dict) as Markdown. Peak-memory columns
    (MiB above what was allocated before each call, :func:`workbench.bench.core.measure`) appear
    when the bench ran on CUDA."""
    meta = r.get("meta", {})
    resident = (
        f"; resident weights of every loaded model {meta['resident_mib']:.0f} MiB"
        if meta.get("resident_mib") is not None
        else ""
    )
    path = meta.get("engine_path")
    lines = [
        f"# wb bench — {meta.get('device', '?')} ({meta.get('date', '')})",
        "",
        f"Command: `{r.get('command', '')}`",
        "",
        *([f"Machine: {meta['host']}.", ""] if meta.get("host") else []),
        f"target `{meta.get('target')}`, draft `{meta.get('draft')}` in {meta.get('dtype', 'float32')}, "
        f"{meta.get('max_new_tokens')} new tokens per sequence (EOS ignored), "
        f"median of {meta.get('repeats')} runs interleaved with the row's contender, torch {meta.get('torch')} with "
        f"{meta.get('torch_threads')} threads on {meta.get('cpu_count')} cores"
        f"{'; our engine torch.compile-d (compilation in the untimed warm-up)' if meta.get('compile') else ''}"
        f"{resident}.",
        *(["", f"Workbench engine: {path} (rollout.prepack_weights, rollout.compile)."] if path else []),
        "",
    ]
    from workbench.vllm.measure import vllm_markdown

    lines += _ar_table(r) if r.get("ar") else []
    peaks = _has_peaks(r)
    lines += [
        "",
        "## Speculative (draft_model), batch 1: ours vs transformers assisted generation",
        "",
        "| k | ours spec tok/s | ours AR tok/s | transformers assisted tok/s | ours / assisted | acceptance length |"
        + (" ours spec peak MiB | assisted peak MiB |" if peaks else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if peaks else ""),
    ]
    for x in r.get("assisted", []):
        assisted = _f(x.get("hf_assisted_tok_s"), 0) if not x.get("hf_assisted_error") else "error"
        lines.append(
            f"| {x['k']} | {_f(x['ours_spec_tok_s'], 0)} | {_f(x['ours_ar_tok_s'], 0)} | {assisted} | "
            f"{_f(x.get('ratio'))} | {_f(x['acceptance_length'])} |"
            + (f" {_f(x.get('ours_spec_peak_mib'), 0)} | {_f(x.get('hf_assisted_peak_mib'), 0)} |" if peaks else "")
        )
    errors = sorted({x["hf_assisted_error"] for x in r.get("assisted", []) if x.get("hf_assisted_error")})
    if errors:
        lines += ["", "transformers assisted generation raised: " + "; ".join(f"`{e}`" for e in errors)]
    m = r.get("model", {})
    if m:
        curve = m["costs"]["target_curve_s"]
        t1 = curve[1] if 1 in curve else curve["1"]
        lines += [
            "",
            f"## Performance model at batch {m['batch']} (Leviathan et al. with the measured verification cost)",
            "",
            "Target forward cost vs tokens per row (relative to 1): "
            + ", ".join(f"{T}: {v / t1:.2f}" for T, v in curve.items()),
            "",
            "c: drafter seconds per draft token inside a real generation / one target step; predicted per row: "
            "E[N] / (k·c + verify cost); predicted: the same step cost over the batch's simulated steps (the "
            "slowest of the rows sets them); measured = median ratio of the interleaved repeats; paired "
            "[95 % CI] = geometric mean of the per-repeat ratios (each speculative run timed beside an "
            "autoregressive one) with a Student-t interval; efficiency = measured / predicted."
            + (
                f" Our autoregressive engine at this batch: {_f(m.get('ar_tok_s'), 0)} tok/s, peak "
                f"{_f(m.get('ar_peak_mib'), 0)} MiB."
                if peaks
                else ""
            ),
            "",
            "| drafter | k | α | c | verify cost | acc. length | predicted per row | predicted | measured | paired "
            "[95 % CI] | efficiency |" + (" peak MiB |" if peaks else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if peaks else ""),
        ]
        for x in m["rows"]:
            lines.append(
                f"| {x['drafter']} | {x['k']} | {_f(x['alpha'])} | {_f(x['c'])} | {_f(x['verify_cost'])} | "
                f"{_f(x['acceptance_length'])} | "
                f"{_f(x.get('predicted_per_row'))} | {_f(x['predicted_speedup'])} | {_f(x['measured_speedup'])} | "
                f"{_ci(x)} | {_f(x['efficiency'])} |" + (f" {_f(x.get('spec_peak_mib'), 0)} |" if peaks else "")
            )
    lines += vllm_markdown(r.get("vllm", []), meta)
    return "\n".join(lines) + "\n"


def _goal(value: float | None, goal: float) -> str:
    return "not measured" if value is None else f"{value:.2f} ({'met' if value >= goal else 'not met'}: goal >= {goal})"


def summary_markdown(results: dict[str, dict], title: str = "GPU benchmark summary") -> str:
    """One page over several ``wb bench`` results (label → the JSON's dict): per result, ours vs
    transformers' best generate() per batch, the best k per drafter at the model table's batch
    (measured speedup over our autoregressive engine), peak memory, and the GPU targets: ours /
    best transformers at batch 64 >= 1.5, eagle3's best k >= 1.5 × our autoregressive engine."""
    lines = [f"# {title}", ""]
    for label, r in results.items():
        meta = r.get("meta", {})
        lines += [
            f"## {label}",
            "",
            f"{meta.get('device', '?')}, {meta.get('dtype', 'float32')}, target `{meta.get('target')}`, "
            f"draft `{meta.get('draft')}`, {meta.get('max_new_tokens')} new tokens, {meta.get('date', '')}",
            "",
            f"Command: `{r.get('command', '')}`",
            "",
            "| batch | ours tok/s | best transformers tok/s | ours / best transformers | ours peak MiB | "
            "transformers peak MiB |",
            "|---|---|---|---|---|---|",
        ]
        goal_ar = None
        for x in r.get("ar", []):
            hf = [
                (x.get(f"{n}_tok_s"), x.get(f"{n}_peak_mib"))
                for n in ("hf_generate", "hf_static")
                if x.get(f"{n}_tok_s")
            ]
            best = max(hf, key=lambda t: t[0], default=(None, None))
            lines.append(
                f"| {x['batch']} | {_f(x['ours_tok_s'], 0)} | {_f(best[0], 0)} | {_f(x.get('ratio'))} | "
                f"{_f(x.get('ours_peak_mib'), 0)} | {_f(best[1], 0)} |"
            )
            if x["batch"] == GOAL_AR_BATCH:
                goal_ar = x.get("ratio")
        m = r.get("model", {})
        best_k: dict[str, dict] = {}
        for x in m.get("rows", []):
            if x["drafter"] not in best_k or x["measured_speedup"] > best_k[x["drafter"]]["measured_speedup"]:
                best_k[x["drafter"]] = x
        if best_k:
            lines += [
                "",
                f"Speculative at batch {m.get('batch')} (vs our autoregressive engine, {_f(m.get('ar_tok_s'), 0)} "
                "tok/s):",
                "",
                "| drafter | best k | measured speedup | acceptance length | peak MiB |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {d} | {x['k']} | {_f(x['measured_speedup'])} | {_f(x['acceptance_length'])} | "
                f"{_f(x.get('spec_peak_mib'), 0)} |"
                for d, x in best_k.items()
            ]
        eagle3 = best_k.get("eagle3", {}).get("measured_speedup")
        lines += [
            "",
            f"- ours / best transformers at batch {GOAL_AR_BATCH}: {_goal(goal_ar, GOAL_AR_RATIO)}",
            f"- eagle3 best k / our autoregressive: {_goal(eagle3, GOAL_EAGLE3_SPEEDUP)}",
            "",
        ]
    return "\n".join(lines)
