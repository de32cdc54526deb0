"""A/B of LeanLM decode-step time, interleaved in one process:
python benchmarks/ab_decode.py OLD/workbench/rollout/model.py

"before" = the model.py given (e.g. from `git worktree add /tmp/before REV`), "after" = the installed one.
"""

import importlib.util
import statistics
import sys
import time

import torch

from workbench.models import load_model, resolve_model
from workbench.rollout import model as after_mod

spec = importlib.util.spec_from_file_location("before_model", sys.argv[1])
before_mod = importlib.util.module_from_spec(spec)
sys.modules["before_model"] = before_mod
spec.loader.exec_module(before_mod)
hf, _ = load_model(resolve_model("tiny"))
models = {"before": before_mod.LeanLM.from_hf(hf), "after": after_mod.LeanLM.from_hf(hf)}


def decode(lm, B, steps=64):
    cache = lm.new_cache(B, 48 + steps + 1)
    x = torch.randint(3, 500, (B, 48))
    lm(x, torch.zeros(B, dtype=torch.long), cache)
    tok = torch.randint(3, 500, (B, 1))
    t0 = time.perf_counter()
    for i in range(steps):
        lm(tok, torch.full((B,), 48 + i), cache)
    return (time.perf_counter() - t0) / steps


for B in (1, 8, 64):
    res = {k: [] for k in models}
    for rep in range(12):
        for k, lm in models.items() if rep % 2 == 0 else reversed(list(models.items())):
            res[k].append(decode(lm, B))
    b, a = statistics.median(res["before"]), statistics.median(res["after"])
    print(
        f"batch {B}: before {1e3 * b:.3f} ms/step, after {1e3 * a:.3f} ms/step, before/after {b / a:.3f} "
        "(IQR before "
        f"{1e3 * (statistics.quantiles(res['before'], n=4)[2] - statistics.quantiles(res['before'], n=4)[0]):.3f} ms)"
    )
print(torch.__version__, torch.get_num_threads(), "threads")
