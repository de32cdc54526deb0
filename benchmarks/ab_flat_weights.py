"""In-process, interleaved A/B of the compiled decode step: an older ``workbench/rollout/model.py``
(its ``static_forward(lm, ..., fused, tk)`` taking the module) against the current one (flat weight
list, ``LeanLM._flat_weights``), through the real engine at batch 1, 8 and 64 (median of 9).

Usage: git worktree add /tmp/old <commit>; python benchmarks/ab_flat_weights.py /tmp/old/workbench/rollout/model.py
(the entry-7 baseline is commit 2931768).
"""

import importlib.util
import statistics
import sys
import time

import torch

from workbench.bench import Bench, BenchConfig
from workbench.cli import _load
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM

spec = importlib.util.spec_from_file_location("oldmodel", sys.argv[1])
old = importlib.util.module_from_spec(spec)
sys.modules["oldmodel"] = old
spec.loader.exec_module(old)
b = Bench(_load(None, []), BenchConfig(batch_sizes=(64,), compile=True))
lm = b.target
old_comp = torch.compile(old.static_forward, dynamic=True)
new_fwd = lm.forward


def old_fwd(input_ids, start_pos, cache, hidden_layers=(), logits_col=None):
    if not hidden_layers and logits_col is None:
        need = int(start_pos.max()) + input_ids.shape[1]
        tk = min(cache.max_len, -(-need // 32) * 32)
        return old_comp(lm, input_ids, start_pos, cache.k, cache.v, lm.__dict__["_fused"], tk), {}
    return LeanLM.forward(lm, input_ids, start_pos, cache, hidden_layers, logits_col)


runs = {"ar1": b.prompts[:1], "ar8": b.prompts[:8], "ar64": b.prompts[:64]}
eng = RolloutEngine(lm)
res = {}
with torch.no_grad():
    for variant, f in (("old", old_fwd), ("new", new_fwd)):
        lm.forward = f
        for p in runs.values():
            b._ours(eng, p)()
            b._ours(eng, p)()
    for _ in range(9):
        for variant, f in (("old", old_fwd), ("new", new_fwd)):
            lm.forward = f
            for n, p in runs.items():
                t0 = time.perf_counter()
                b._ours(eng, p)()
                res.setdefault((variant, n), []).append(time.perf_counter() - t0)
for n in runs:
    o, nw = statistics.median(res[("old", n)]), statistics.median(res[("new", n)])
    print(n, f"old {1e3 * o:.1f} ms new {1e3 * nw:.1f} ms new/old {nw / o:.3f}")
