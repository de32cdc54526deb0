"""The engine review's GPU proofs (issue #24) in one run: what the CPU cannot show.

Per engine (autoregressive, and speculative with ``--drafter`` at ``--k``), generating ``--batch``
rows of ``--max-new-tokens`` tokens (EOS off) as CUDA graphs (``enable_compile(cuda_graphs=True)``),
after one warm-up generation that compiles and records:

1. **Host syncs per step.** ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising
   CUDA call warn; the engine's hot loop reads the device once per step by design (one packed
   vector), so the warnings counted over a generation must stay within steps + a few (prefill,
   the final read-back). An implicit sync (a pageable copy, a ``.item()``) shows up as more.
2. **No weight copies per graph replay.** Inputs of a CUDA graph that are not static addresses are
   copied into the graph's own buffers at every replay. The fused weights and RoPE tables are
   marked static (``torch._dynamo.mark_static_address``); if that failed, each decode step would
   copy most of the weights device to device. ``torch.profiler`` counts the device time of
   memcpy device-to-device kernels during the generation; it must stay below ``--max-memcpy-frac``
   of the generation's device time (a step of this regime reads the weights once, so copying them
   would cost about as much as the step).
3. **No graph skipped.** ``cudagraph_skips()`` (torch's counter of graphs it declined to record)
   stays 0; gpu.sh also sets ``TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1`` so a skip fails loudly.

On a CPU (``--device cpu``, gpu.sh --smoke) the engines run eager and the three checks are reported
as skipped: the script's path runs, nothing is proven. Exit status 1 when a check
fails. Writes ``--out`` (JSON).

    python benchmarks/engine_checks.py --target <checkpoint> --draft <checkpoint> --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings

import torch

from workbench.models import load_model, resolve_model
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.graphs import cudagraph_skips
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams


def _lm(name: str, device: str, dtype: str) -> LeanLM:
    hf, _ = load_model(resolve_model(name, what="--target/--draft"), device=device, dtype=dtype)
    return LeanLM.from_hf(hf)


def count_syncs(fn) -> tuple[int, object]:
    """(synchronising CUDA calls ``fn`` made, its result), from torch's sync debug warnings."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught), out


def memcpy_dtod_fraction(fn) -> tuple[float, float]:
    """(device seconds of memcpy device-to-device kernels, of all device kernels) while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    dtod = total = 0.0
    for e in prof.events():
        t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)  # microseconds
        if e.device_type.name != "CUDA":
            continue
        total += t
        if "Memcpy DtoD" in e.name or "Memcpy PtoP" in e.name:
            dtod += t
    return dtod / 1e6, total / 1e6


def check_engine(name: str, eng: RolloutEngine, prompts, sp, cuda: bool, max_frac: float, max_extra_syncs: int) -> dict:
    gen = lambda: eng.generate(prompts, sp, torch.Generator(eng.device).manual_seed(0))  # noqa: E731
    t0 = time.perf_counter()
    gen()  # compiles / records graphs
    warmup_s = time.perf_counter() - t0
    print(f"{name}: warm-up (compile, graph capture) {warmup_s:.1f} s", flush=True)
    walls = []
    for _ in range(3):  # wall seconds of a whole generation (the engine reads the device each step: no sync needed)
        t0 = time.perf_counter()
        out = gen()
        walls.append(time.perf_counter() - t0)
    steps = out.counters.num_verify_steps
    tokens = sum(map(len, out.tokens))
    res = {
        "engine": name,
        "steps": steps,
        "tokens": tokens,
        "warmup_s": round(warmup_s, 2),
        "gen_s_median": round(statistics.median(walls), 4),
        "tokens_per_s": round(tokens / statistics.median(walls), 1),
    }
    if not cuda:
        return res | {"checks": "skipped (not CUDA): the script ran, nothing proven"}
    skips0 = cudagraph_skips()
    syncs, out = count_syncs(gen)
    dtod_s, dev_s = memcpy_dtod_fraction(gen)
    res |= {
        "syncs": syncs,
        "syncs_allowed": steps + max_extra_syncs,
        "memcpy_dtod_s": dtod_s,
        "device_s": dev_s,
        "memcpy_dtod_frac": dtod_s / dev_s if dev_s else None,
        "cudagraph_skips": cudagraph_skips() - skips0,
    }
    res["pass"] = {
        "syncs": syncs <= steps + max_extra_syncs,
        "weights_not_copied": (res["memcpy_dtod_frac"] or 0.0) <= max_frac,
        "no_graph_skipped": cudagraph_skips() == 0,
    }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--drafter", default="draft_model", choices=["draft_model", "none"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-memcpy-frac", type=float, default=0.05)
    ap.add_argument("--max-extra-syncs", type=int, default=8)
    ap.add_argument("--out", default="engine-checks.json")
    a = ap.parse_args()
    cuda = torch.device(a.device).type == "cuda"
    from drafters.draft_model import DraftModelDrafter

    target = _lm(a.target, a.device, a.dtype)
    engines = {"autoregressive": RolloutEngine(target, max_batch_size=a.batch)}
    if a.drafter == "draft_model":
        engines[f"draft_model k={a.k}"] = RolloutEngine(
            target, DraftModelDrafter(_lm(a.draft, a.device, a.dtype)), k=a.k, max_batch_size=a.batch
        )
    if cuda:  # on the CPU eager: compiling would take minutes of the smoke run and prove nothing here
        for eng in engines.values():
            eng.enable_compile(cuda_graphs=True)
    V = target.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [
        [1] + torch.randint(3, min(V, 512), (int(n),), generator=g).tolist()
        for n in torch.randint(4, 24, (a.batch,), generator=g)
    ]
    sp = SamplingParams(temperature=1.0, max_new_tokens=a.max_new_tokens, eos_token_id=None)
    results = []
    for name, eng in engines.items():  # printed and written per engine: a timeout keeps what finished
        results.append(check_engine(name, eng, prompts, sp, cuda, a.max_memcpy_frac, a.max_extra_syncs))
        print(json.dumps(results[-1]), flush=True)
        with open(a.out, "w") as f:
            json.dump(
                {"device": str(a.device), "dtype": a.dtype, "torch": torch.__version__, "results": results}, f, indent=1
            )
    failed = [f"{r['engine']}: {k}" for r in results for k, ok in r.get("pass", {}).items() if not ok]
    if failed:
        print("engine checks FAILED: " + ", ".join(failed), file=sys.stderr)
        return 1
    print("engine checks: " + ("passed" if cuda else "skipped on the CPU (code path ran)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
