"""What vLLM-CPU's library preload (tcmalloc + Intel OpenMP in LD_PRELOAD) changes, for vLLM and for ours.

A preload is fixed when a process starts, so the two arms cannot share a process: each round runs the
same ``wb bench ... --vllm D --only-vllm`` twice, once with ``WB_PRELOAD=0`` and once with
``WB_PRELOAD=1`` (order alternating per round: ABBA), and the per-round ratio preloaded / not of every
tok/s column is summarised as a geometric mean with a Student-t 95 % interval over rounds
(``workbench.stats.ratio_ci``; adjacent runs are the pairs, as in docs/design.md §8). It also counts
vLLM's three startup warnings in each arm's output.

    python benchmarks/preload_ab.py membound --rounds 4 --name preload-ab-membound-cpu -- \
        --vllm draft_model --batch-sizes 1,4 --max-new-tokens 64 --repeats 5

Writes benchmarks/<name>.json and .md (with the command).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.stats import ratio_ci

COLUMNS = ("ours_ar_tok_s", "vllm_ar_tok_s", "ours_spec_greedy_tok_s", "vllm_spec_greedy_tok_s")
WARNINGS = {
    "libtcmalloc": "libtcmalloc is not found in LD_PRELOAD",
    "libiomp": "libiomp is not found in LD_PRELOAD",
    "spec_iomp": "Speculative decoding on CPU without Intel OpenMP",
}


def one_run(spec: str, bench_args: list[str], preload: bool, out: Path, name: str) -> dict:
    """One ``wb bench`` process; returns its vLLM rows by batch and the warnings it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "WB_PRELOADED")}
    env["WB_PRELOAD"] = "1" if preload else "0"
    env["VLLM_LOGGING_LEVEL"] = "WARNING"  # its warnings are what is counted
    cmd = ["wb", "bench", spec, *bench_args, "--only-vllm", "--out", str(out), "--name", name]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    text = p.stdout + p.stderr
    res = json.loads((out / f"{name}.json").read_text())
    return {
        "rows": {r["batch"]: r for r in res["vllm"]},
        "meta": res["meta"],
        "wall_s": time.perf_counter() - t0,
        "warnings": {k: text.count(v) for k, v in WARNINGS.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--name", default="preload-ab")
    ap.add_argument("--out", default="benchmarks")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    bench_args = argv[cut + 1 :]  # after --: the wb bench options
    runs: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)  # ABBA: no arm always goes first
            for pre in order:
                res = one_run(a.spec, bench_args, pre, Path(tmp), f"r{r}-{int(pre)}")
                runs[pre].append(res)
                print(
                    f"round {r} preload={pre}: {res['wall_s']:.0f} s, warnings {res['warnings']}, "
                    + ", ".join(
                        f"b{b} vLLM AR {row['vllm_ar_tok_s']:.0f} ours AR {row['ours_ar_tok_s']:.0f}"
                        for b, row in res["rows"].items()
                    ),
                    flush=True,
                )
    batches = sorted(runs[False][0]["rows"])
    table = []
    for b in batches:
        row = {"batch": b}
        for c in COLUMNS:
            before = [x["rows"][b][c] for x in runs[False]]
            after = [x["rows"][b][c] for x in runs[True]]
            ci = ratio_ci([y / x for x, y in zip(before, after)])
            row[c] = {
                "before": sorted(before)[len(before) // 2],
                "after": sorted(after)[len(after) // 2],
                "ratio": {"mean": ci.mean, "lo": ci.low, "hi": ci.high, "n": ci.n},
            }
        for arm, pre in (("before", False), ("after", True)):  # ours / vLLM within each arm (same process)
            row[f"ours_over_vllm_ar_{arm}"] = ratio_ci(
                [x["rows"][b]["ours_ar_tok_s"] / x["rows"][b]["vllm_ar_tok_s"] for x in runs[pre]]
            ).mean
        table.append(row)
    command = (
        f"python benchmarks/preload_ab.py {a.spec} --rounds {a.rounds} --name {a.name} -- {shlex.join(bench_args)}"
    )
    result = {
        "command": command,
        "meta": runs[True][0]["meta"],
        "table": table,
        "warnings": {str(k): [x["warnings"] for x in v] for k, v in runs.items()},
        "meta_before": runs[False][0]["meta"],
    }
    out = Path(a.out)
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [
        "# vLLM-CPU's preload (tcmalloc + Intel OpenMP): before / after\n",
        f"Command: `{command}`\n",
        f"Machine: {result['meta'].get('processor')} ({result['meta'].get('cpu_count')} cores), torch "
        f"{result['meta'].get('torch')}, {result['meta'].get('date')}; LD_PRELOAD after: "
        f"`{result['meta'].get('ld_preload')}`, before: `{result['meta_before'].get('ld_preload') or '(none)'}`.\n",
        "vLLM's startup warnings per run (before → after): "
        + "; ".join(
            f"{k}: {sum(w[k] for w in result['warnings']['False'])} → {sum(w[k] for w in result['warnings']['True'])}"
            for k in WARNINGS
        )
        + "\n",
        "| batch | column | before tok/s | after tok/s | after / before [95 % CI] |",
        "|---|---|---|---|---|",
    ]
    for row in table:
        for c in COLUMNS:
            r = row[c]["ratio"]
            ci = f"[{r['lo']:.2f}, {r['hi']:.2f}]" if r["lo"] is not None else ""
            md.append(
                f"| {row['batch']} | {c} | {row[c]['before']:.0f} | {row[c]['after']:.0f} | {r['mean']:.2f}× {ci} |"
            )
    md.append(
        "\nours / vLLM (plain), geometric mean over rounds: "
        + "; ".join(
            f"batch {r['batch']}: {r['ours_over_vllm_ar_before']:.2f} before, {r['ours_over_vllm_ar_after']:.2f} after"
            for r in table
        )
    )
    (out / f"{a.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
