"""Where a decode step's time goes in each engine: ours (LeanLM, eager) and vLLM-CPU, plain decoding
of one spec's prompts, in one process (issue #32 part 2: "profile both engines ... at batch 1/4/16").

    python benchmarks/profile_engines.py membound --batch-sizes 1,4,16 --max-new-tokens 64 --repeats 5 \
        --out benchmarks/profile-engines-membound-cpu

Per batch size: (1) both engines generate the same prompts (the spec's sampling, EOS ignored),
interleaved ``--repeats`` times, each engine step timed (``workbench.vllm.measure.timed_steps``):
wall tok/s, the median decode-step seconds (steps after the prefill) and the fixed rest (wall minus
the steps); (2) one more generation of each under ``torch.profiler`` (CPU activity): self CPU time
per op name, divided by the engine's decode steps, the top ``--top`` ops each, and the op calls per
step. vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as ``wb`` sets), so the
profiler sees its model runner's ops (its attention and its matmuls) as it sees ours.

``--speculative DRAFTER``: the same for speculative decoding (greedy, the spec's drafter.k): a step
is then a (k+1)-token verification plus the drafter's work, and both engines take the same steps.

Writes OUT.json (every number) and OUT.md (the tables). Numbers are from the machine it runs on;
time nothing else beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from workbench.bench.core import Bench, BenchConfig
from workbench.prepack_rows import measured_min_rows
from workbench.specs.load import load_spec
from workbench.stats import paired_ratios, ratio_ci
from workbench.vllm.measure import timed_steps, vllm_bench_spec

MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "_C::onednn_mm",
    "mkl::_mkl_linear",
    "aten::_mkl_linear",
    "mkldnn::_linear_pointwise",
)


def category(op: str) -> str:
    """matmul | attention | compiled graph (inductor's fused kernels, one record per call) | other."""
    low = op.lower()
    if op in MATMUL:
        return "matmul"
    if "attention" in low or "attn" in low or "sdpa" in low or "flash" in low:
        return "attention"
    if "compiledfxgraph" in low:
        return "compiled graph"
    return "other"


def op_table(prof, steps: int, top: int) -> tuple[list[dict], int, float, dict[str, float]]:
    """(top ops by self CPU time per decode step [{op, ms_per_step, calls_per_step}], op calls per
    step, total self CPU ms per step, {category: self CPU ms per step}) of one profiled generation
    with ``steps`` decode steps (the prefill's ops are in the totals too: a 1/steps share)."""
    self_us, calls = defaultdict(float), defaultdict(int)
    for e in prof.key_averages():
        self_us[e.key] += e.self_cpu_time_total
        calls[e.key] += e.count
    rows = sorted(self_us, key=self_us.get, reverse=True)
    total_ms = sum(self_us.values()) / 1e3 / steps
    cats: dict[str, float] = defaultdict(float)
    for k, us in self_us.items():
        cats[category(k)] += us / 1e3 / steps
    out = [{"op": k, "ms_per_step": self_us[k] / 1e3 / steps, "calls_per_step": calls[k] / steps} for k in rows[:top]]
    return out, round(sum(calls.values()) / steps), total_ms, dict(cats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="also ours with torch.compile (rollout.compile), as vLLM-CPU compiles its model",
    )
    ap.add_argument(
        "--prepacked",
        action="store_true",
        help="also ours with its weights packed for oneDNN (rollout.prepack_weights)",
    )
    ap.add_argument(
        "--speculative",
        metavar="DRAFTER",
        choices=["draft_model", "eagle3", "ngram"],
        help="profile speculative decoding with this drafter at the spec's drafter.k instead of plain decoding "
        "(greedy in both engines, as wb bench --vllm: same tokens, same steps)",
    )
    ap.add_argument("overrides", nargs="*", help="dotted spec overrides, e.g. model.device=cpu")
    a = ap.parse_args()
    from workbench.vllm.runtime import VLLMBackend

    bs = [int(x) for x in a.batch_sizes.split(",")]
    spec = load_spec(a.spec, a.overrides)
    b = Bench(spec, BenchConfig(batch_sizes=tuple(bs), max_new_tokens=a.max_new_tokens, repeats=a.repeats, hf=False))
    kind = a.speculative or b.spec.drafter.kind
    vspec = vllm_bench_spec(b.spec, kind, b.spec.drafter.k, bs)
    if a.speculative:  # a (k+1)-token verification step and its drafts in each engine, greedy
        from workbench.rollout.sampling import SamplingParams
        from workbench.vllm import vllm_backend

        b.sp = SamplingParams(0.0, 1.0, 0, a.max_new_tokens, None)
        ours = b._engine(kind, b.spec.drafter.k)
        vllm = vllm_backend(vspec, b.target_path, b.device.type, ours.drafter, None, b.target.cfg, tags={})
    else:
        ours, vllm = b._ar_engine(), VLLMBackend(b.target_path, vspec, b.device.type, None, seed=spec.seed)
    engines = {"ours": ours, "vllm": vllm}
    if a.compiled:  # a second LeanLM over the same weights, its plain forwards compiled
        # (docs/results/engine-optimisation-log.md §3)
        from workbench.rollout.model import LeanLM
        from workbench.rollout.workbench_backend import WorkbenchBackend

        lm = LeanLM.from_hf(b.hf_target)
        lm.enable_compile(False)
        engines["ours_compiled"] = WorkbenchBackend(lm)
    if a.prepacked:  # a third LeanLM, eager, its linear weights packed for oneDNN
        from workbench.rollout.model import LeanLM
        from workbench.rollout.workbench_backend import WorkbenchBackend

        engines["ours_prepacked"] = WorkbenchBackend(
            LeanLM.from_hf(b.hf_target), prepack=True, prepack_min_rows=measured_min_rows
        )
    if a.speculative and (a.compiled or a.prepacked):
        ap.error(
            "--speculative profiles ours as the spec sets it up (rollout.prepack_weights=true as an override); "
            "drop --compiled/--prepacked"
        )
    res = {
        "spec": a.spec,
        "speculative": a.speculative,
        "k": b.spec.drafter.k if a.speculative else 0,
        "command": " ".join(["python", *sys.argv]),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "max_new_tokens": a.max_new_tokens,
        "rows": [],
    }
    try:
        for B in bs:
            prompts = b.prompts[:B]
            for e in engines.values():  # warm-up
                timed_steps(e, prompts, b.sp)
            runs = {n: [] for n in engines}
            for r in range(a.repeats):
                names = list(engines)
                for n in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates per repeat
                    runs[n].append(timed_steps(engines[n], prompts, b.sp))
            row = {"batch": B}
            for n, rs in runs.items():
                dec = [s for run in rs for s in run.step_s[1:]]
                wall = [run.wall_s for run in rs]
                row[n] = {
                    "tok_s": B * a.max_new_tokens / statistics.median(wall),
                    "steps": len(rs[0].step_s),
                    "decode_step_ms": 1e3 * statistics.median(dec),
                    "prefill_ms": 1e3 * statistics.median(run.step_s[0] for run in rs),
                    "rest_ms": 1e3 * statistics.median(run.wall_s - sum(run.step_s) for run in rs),
                    "wall_s": wall,
                }
            ci = ratio_ci(paired_ratios([r.wall_s for r in runs["vllm"]], [r.wall_s for r in runs["ours"]]))
            row["ours_over_vllm"] = {"mean": ci.mean, "lo": ci.low, "hi": ci.high}
            for n in ("ours_compiled", "ours_prepacked"):
                if n in runs:
                    ci = ratio_ci(paired_ratios([r.wall_s for r in runs["vllm"]], [r.wall_s for r in runs[n]]))
                    row[f"{n}_over_vllm"] = {"mean": ci.mean, "lo": ci.low, "hi": ci.high}
                    ci = ratio_ci(paired_ratios([r.wall_s for r in runs["ours"]], [r.wall_s for r in runs[n]]))
                    row[f"{n}_over_ours"] = {"mean": ci.mean, "lo": ci.low, "hi": ci.high}  # paired per repeat
            for n, e in engines.items():
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    t0 = time.perf_counter()
                    run = timed_steps(e, prompts, b.sp)
                    row[n]["profiled_wall_s"] = time.perf_counter() - t0
                ops, calls, total, cats = op_table(prof, max(len(run.step_s) - 1, 1), a.top)
                row[n] |= {
                    "top_ops": ops,
                    "op_calls_per_step": calls,
                    "self_cpu_ms_per_step": total,
                    "categories_ms_per_step": cats,
                }
            res["rows"].append(row)
            print(
                json.dumps(
                    {
                        k: (
                            v
                            if k == "batch"
                            else {kk: vv for kk, vv in v.items() if kk != "top_ops"}
                            if isinstance(v, dict) and "tok_s" in v
                            else v
                        )
                        for k, v in row.items()
                    }
                ),
                flush=True,
            )
    finally:
        vllm.close()
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


def _ci(c: dict) -> str:
    return f"{c['mean']:.2f}× [{c['lo']:.2f}, {c['hi']:.2f}]"


def markdown(res: dict) -> str:
    """The summary table, the time per category, and each batch's top ops side by side."""
    names = [n for n in ("ours", "ours_compiled", "ours_prepacked", "vllm") if n in res["rows"][0]]
    extra = [n for n in ("ours_compiled", "ours_prepacked") if n in names]
    what = (
        f"speculative ({res['speculative']}, k = {res['k']}, greedy) step" if res.get("speculative") else "Decode step"
    )
    lines = [
        f"# {what} profile, ours vs vLLM-CPU: `{res['spec']}`",
        "",
        f"`{res['command']}`; torch {res['torch']}, {res['threads']} threads, {res['max_new_tokens']} tokens per row.",
        "",
        "| batch | "
        + " | ".join(f"{n} tok/s" for n in names)
        + " | ours / vLLM [95 %] |"
        + "".join(f" {n} / vLLM [95 %] | {n} / ours [95 %] |" for n in extra)
        + " | ".join(f" {n} decode step ms" for n in names)
        + " |",
        "|---" * (2 + 2 * len(names) + 2 * len(extra)) + "|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['batch']} | "
            + " | ".join(f"{r[n]['tok_s']:.1f}" for n in names)
            + f" | {_ci(r['ours_over_vllm'])} |"
            + "".join(f" {_ci(r[f'{n}_over_vllm'])} | {_ci(r[f'{n}_over_ours'])} |" for n in extra)
            + " | ".join(f" {r[n]['decode_step_ms']:.2f}" for n in names)
            + " |"
        )
    cats = ("matmul", "attention", "compiled graph", "other")
    lines += [
        "",
        "Self CPU ms per decode step by category (profiled run, profiler overhead included; op calls per step last):",
        "",
        "| batch | engine | " + " | ".join(cats) + " | total | op calls/step |",
        "|---" * (4 + len(cats)) + "|",
    ]
    for r in res["rows"]:
        for n in names:
            c = r[n]["categories_ms_per_step"]
            lines.append(
                f"| {r['batch']} | {n} | "
                + " | ".join(f"{c.get(x, 0.0):.2f}" for x in cats)
                + f" | {r[n]['self_cpu_ms_per_step']:.2f} | {r[n]['op_calls_per_step']} |"
            )
    for r in res["rows"]:
        lines += [
            "",
            f"## Batch {r['batch']}: top ops, self CPU ms per decode step",
            "",
            "| " + " | ".join(f"{n} op | ms | calls" for n in names) + " |",
            "|---" * (3 * len(names)) + "|",
        ]
        for ops in zip(*(r[n]["top_ops"] for n in names)):
            lines.append(
                "| "
                + " | ".join(f"`{o['op'][:60]}` | {o['ms_per_step']:.3f} | {o['calls_per_step']:.0f}" for o in ops)
                + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
