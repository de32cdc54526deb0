"""Asynchronous vs synchronous GRPO on one machine: exposed generation time and step speedup.

    python benchmarks/async_vs_sync.py [--spec quickstart] [--drafters none,draft_model]
        [--staleness 1] [--repeats 3] [--steps 8] [--out benchmarks/async-vs-sync-cpu]

For each drafter, runs the spec synchronously (A) and with ``grpo.async.enabled`` (B), A B A B ...
``--repeats`` times, same seed (so the same prompts per step). Step t of B is paired with step t of
the A run just before it: per-step ratios A step s / B step s, after the warm-up steps, pooled over
the repeats, summarised as a geometric mean with a Student-t 95 % CI on the logs
(``workbench.stats.ratio_ci``). The runs are adjacent in time, not interleaved within a step
(two trainers cannot share a step), so slow drift on a shared machine enters the ratios; the
repeats' alternation spreads it over both arms.

Also reports the mean exposed generation (``timing_s/gen_exposed``) against the synchronous gen,
and the performance model's async prediction (``workbench.perf.analytic.async_step_time``, what
``wb project`` uses) twice: from the synchronous run's own stage times, gen and the train side
(step - gen), which assumes a device per side; and *on shared cores* from a third, synchronous run
per repeat (C) measured with the torch threads each side of the pipeline gets on this machine
(the worker's, half of them: ``RolloutWorker``), as ``wb project --async-run RUN`` does with a run
started under ``OMP_NUM_THREADS``. Its gen and train side are what the worker and the trainer
each do on their share of the cores.
Writes ``<out>.json`` and ``<out>.md`` with this command line.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from workbench.experiment import run_experiment
from workbench.perf.analytic import async_step_time
from workbench.specs import load_spec
from workbench.stats import after_warmup, ratio_ci


def _run(spec_name: str, overrides: list[str]) -> list[dict]:
    return run_experiment(load_spec(spec_name, overrides), progress=False).history


def _mean(history: list[dict], key: str, warmup: int) -> float:
    return statistics.fmean(after_warmup([h[key] for h in history], warmup))


def _run_with_threads(spec_name: str, overrides: list[str], threads: int) -> list[dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(spec_name, overrides)
    finally:
        torch.set_num_threads(before)


def measure(spec: str, drafter: str, staleness: int, repeats: int, steps: int, warmup: int) -> dict:
    base = [
        f"drafter.kind={drafter}",
        f"grpo.steps={steps}",
        "grpo.eval_every=0",
        "measure.paired=false",
        "tracking.enabled=false",
    ]
    share = max(1, torch.get_num_threads() // 2)  # the worker's threads (workbench.grpo.trainer: RolloutWorker)
    ratios, a_runs, b_runs, c_runs = [], [], [], []
    for _ in range(repeats):
        a = _run(spec, base)
        b = _run(spec, base + ["grpo.async.enabled=true", f"grpo.async.staleness={staleness}"])
        c_runs.append(_run_with_threads(spec, base, share))
        a_runs.append(a)
        b_runs.append(b)
        ratios += after_warmup([x["timing_s/step"] / y["timing_s/step"] for x, y in zip(a, b)], warmup)
    ci = ratio_ci(ratios)
    gen = statistics.fmean(_mean(a, "timing_s/gen", warmup) for a in a_runs)
    sync_step = statistics.fmean(_mean(a, "timing_s/step", warmup) for a in a_runs)
    async_step = statistics.fmean(_mean(b, "timing_s/step", warmup) for b in b_runs)
    predicted = async_step_time(gen, sync_step - gen, staleness)
    gen_sh = statistics.fmean(_mean(c, "timing_s/gen", warmup) for c in c_runs)
    step_sh = statistics.fmean(_mean(c, "timing_s/step", warmup) for c in c_runs)
    predicted_sh = async_step_time(gen_sh, step_sh - gen_sh, staleness)
    return {
        "share_threads": share,
        "share_gen_s": gen_sh,
        "share_train_side_s": step_sh - gen_sh,
        "predicted_shared_async_step_s": predicted_sh,
        "predicted_shared_step_speedup": sync_step / predicted_sh,
        "prediction_shared_error": predicted_sh / async_step - 1.0,
        "drafter": drafter,
        "staleness": staleness,
        "repeats": repeats,
        "steps": steps,
        "warmup_steps": warmup,
        "sync_gen_s": gen,
        "sync_step_s": sync_step,
        "async_gen_exposed_s": statistics.fmean(_mean(b, "timing_s/gen_exposed", warmup) for b in b_runs),
        "async_worker_gen_s": statistics.fmean(_mean(b, "timing_s/gen", warmup) for b in b_runs),
        "async_step_s": async_step,
        "step_speedup": ci.mean,
        "ci_low": ci.low,
        "ci_high": ci.high,
        "n_ratios": ci.n,
        "predicted_async_step_s": predicted,
        "predicted_step_speedup": sync_step / predicted,
        "prediction_error": predicted / async_step - 1.0,
    }


def to_markdown(r: dict) -> str:
    m = r["meta"]
    lines = [
        f"# Asynchronous vs synchronous GRPO ({m['machine']}, {m['date']})",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Spec `{m['spec']}`, {m['steps']} steps per run (first {m['warmup']} left out), {m['repeats']} A/B repeats, "
        f"torch {m['torch']} with {m['threads']} threads on {m['cpus']} cores. Step speedup: per-step ratios sync step "
        "/ async step of adjacent runs, geometric mean [95 % CI]. Predicted: `wb project`'s async model (a) from the "
        "sync run's gen and train side (a device per side), (b) on shared cores: from a sync run with the threads "
        "each side gets (gen and train "
        "side at the worker's thread count; `wb project --async-run`).",
        "",
        "| drafter | s | sync gen s | async exposed gen s | worker gen s | sync step s | async step s | step speedup "
        "[95 % CI] | predicted (a) | error (a) | gen, train side on shared cores s | predicted (b) | error (b) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        ci = (
            f"{x['step_speedup']:.2f}× [{x['ci_low']:.2f}, {x['ci_high']:.2f}]"
            if x["ci_low"] is not None
            else f"{x['step_speedup']:.2f}×"
        )
        lines.append(
            f"| {x['drafter']} | {x['staleness']} | {x['sync_gen_s']:.3f} | {x['async_gen_exposed_s']:.3f} | "
            f"{x['async_worker_gen_s']:.3f} | "
            f"{x['sync_step_s']:.3f} | {x['async_step_s']:.3f} | {ci} | {x['predicted_step_speedup']:.2f}× | "
            f"{x['prediction_error']:+.0%} | "
            f"{x['share_gen_s']:.3f}, {x['share_train_side_s']:.3f} ({x['share_threads']} thr.) | "
            f"{x['predicted_shared_step_speedup']:.2f}× | {x['prediction_shared_error']:+.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="quickstart")
    p.add_argument("--drafters", default="none,draft_model")
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default="benchmarks/async-vs-sync-cpu")
    a = p.parse_args(argv)
    rows = [
        measure(a.spec, d.strip(), a.staleness, a.repeats, a.steps, a.warmup)
        for d in a.drafters.split(",")
        if d.strip()
    ]
    meta = {
        "spec": a.spec,
        "steps": a.steps,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": __import__("os").cpu_count(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    result = {
        "command": "python benchmarks/async_vs_sync.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "meta": meta,
        "rows": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(to_markdown(result))
    print(to_markdown(result))


if __name__ == "__main__":
    main()
