"""Exactness on a GPU: the CPU suite's parity and law checks, run on ``--device`` (default cuda).

The suite (tests/) runs on the CPU only, where CI runs; CUDA kernels (cuBLAS GEMMs whose reduction
order depends on the row count, SDPA/flash attention, CUDA graphs, the CUDA random generator) are a
different code path. This script re-runs the suite's strongest checks there, on the suite's own
checkpoints (tests/arch_cases.py: sharp random weights of every supported family):

1. **float32 parity** (TF32 off) per family: the engine's logits through the KV cache (prefill, then
   verification-sized chunks at per-row positions) against transformers' forward, max |Δlogit|;
   greedy plain decoding token for token against transformers' ``generate()``; greedy speculative
   decoding (ngram, draft_model as itself and as another model, mtp and eagle3 random heads; k = 3)
   token for token against plain decoding.
2. **CUDA graphs** (``enable_compile(cuda_graphs=True)``) on qwen3: logits against eager, greedy
   speculative draft_model against eager plain decoding.
3. **bfloat16**: greedy speculative against plain decoding per drafter with
   ``fixed_attention_length`` (as tests/test_architectures.py on the CPU). Reported, not asserted
   first: on a GPU a (k+1)-row verification GEMM may round differently from a 1-row decode GEMM, so
   a bf16 near-tie can flip; the number of diverging (case, drafter) settings is the finding.
4. **Sampled law**: n speculative rollouts of 3 tokens over an 8-id vocabulary (512 joint cells,
   enumerated exactly) chi-squared against the target's exact law, per drafter (draft_model, ngram,
   suffix, mtp, eagle3 trained briefly on the target's rollouts), with the CUDA generator;
   p > 1e-4 passes (tests/conftest.py ``assert_rollouts_follow_target``).

    python benchmarks/cuda_parity.py --device cuda --out cuda-parity.json

Writes ``--out`` (JSON: one record per check, ``ok`` and the measured value) and prints a table;
exit status 1 if an asserted check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from drafters import DrafterTarget, build_drafter  # noqa: E402
from drafters.draft_model import DraftModelDrafter  # noqa: E402
from drafters.ngram import NgramDrafter  # noqa: E402
from drafters.suffix import SuffixDrafter  # noqa: E402
from drafters.training import completion_loss_mask, fit, lean_target_states, split_rows  # noqa: E402
from workbench.rollout.engine import RolloutEngine  # noqa: E402
from workbench.rollout.model import LeanLM  # noqa: E402
from workbench.rollout.sampling import SamplingParams  # noqa: E402
from workbench.specs import DrafterSpec  # noqa: E402

from arch_cases import CASES, load_hf, make_checkpoint  # noqa: E402
from conftest import exact_joint, random_llama  # noqa: E402

EOS, MAX_NEW, K = 2, 30, 3
G = torch.Generator().manual_seed(0)
PROMPTS = [torch.randint(3, 500, (n,), generator=G).tolist() for n in (3, 12, 25, 40)]  # as tests/test_architectures.py
SEQS = [torch.randint(3, 500, (n,), generator=G).tolist() for n in (30, 47, 62, 81)]
RESULTS: list[dict] = []
OUT: Path | None = None  # written after every record, so a crash or a timeout keeps what ran


def record(check: str, ok: bool | None, value=None, **extra) -> None:
    """One result row; ok None = reported only (not asserted)."""
    RESULTS.append({"check": check, "ok": ok, "value": value, **extra})
    flag = {True: "ok", False: "FAIL", None: "info"}[ok]
    print(f"{flag:5} {check}: {value}", flush=True)
    if OUT is not None:
        OUT.write_text(json.dumps({"results": RESULTS}, indent=1))


def greedy(max_new: int = MAX_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new, eos_token_id=EOS)


@torch.no_grad()
def stepped_logits(lm: LeanLM, seqs: list[list[int]], chunks=(4, 5)) -> list[torch.Tensor]:
    """The engine's logits at every position, computed as rollouts do (right-padded prefill, then
    ``chunks`` tokens per row at per-row positions through the cache): per sequence (L_b, V)."""
    dev, B, tail = lm.lm_head.weight.device, len(seqs), sum(chunks)
    P = max(len(s) for s in seqs) - tail
    ids = torch.zeros(B, P, dtype=torch.long, device=dev)  # (B, P)
    starts = torch.tensor([len(s) - tail for s in seqs], device=dev)
    for b, s in enumerate(seqs):
        ids[b, : starts[b]] = torch.tensor(s[: starts[b]])
    cache = lm.new_cache(B, max(len(s) for s in seqs))
    pre, _ = lm(ids, torch.zeros(B, dtype=torch.long, device=dev), cache)  # (B, P, V)
    # clone: a CUDA graph's output is overwritten by its next replay
    out = [[pre[b, : starts[b]].float().clone()] for b in range(B)]
    for n in chunks:
        step = torch.stack([torch.tensor(s[st : st + n]) for s, st in zip(seqs, starts.tolist())]).to(dev)  # (B, n)
        logits, _ = lm(step, starts, cache)
        for b in range(B):
            out[b].append(logits[b].float().clone())
        starts = starts + n
    return [torch.cat(o) for o in out]


@torch.no_grad()
def hf_logits(hf, seqs):
    dev = next(hf.parameters()).device
    return [hf(torch.tensor([s], device=dev)).logits[0].float() for s in seqs]


def max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@torch.no_grad()
def hf_greedy(hf, prompts, max_new=MAX_NEW):
    dev = next(hf.parameters()).device
    out = []
    for p in prompts:
        ids = hf.generate(
            torch.tensor([p], device=dev), max_new_tokens=max_new, do_sample=False, eos_token_id=EOS, pad_token_id=0
        )
        out.append(ids[0, len(p) :].tolist())
    return out


def drafters_for(lm: LeanLM, other: LeanLM | None, dev: torch.device) -> dict:
    out = {"ngram": NgramDrafter(1, 3), "draft_model self": DraftModelDrafter(lm)}
    if other is not None:
        out["draft_model other"] = DraftModelDrafter(other)
    for kind in ("mtp", "eagle3"):
        out[kind] = build_drafter(kind, DrafterSpec(kind=kind), DrafterTarget(lm), dev)
    return out


def check_family(case: str, root: Path, dev: torch.device) -> None:
    path, other_path = make_checkpoint(root / case, case, 0), make_checkpoint(root / f"{case}-1", case, 1, layers=1)
    hf = load_hf(path).to(dev)
    lm, other = LeanLM.from_hf(hf), LeanLM.from_hf(load_hf(other_path).to(dev))
    d = max_diff(stepped_logits(lm, SEQS), hf_logits(hf, SEQS))
    record(f"fp32 {case}: max |dlogit| vs transformers through the cache", d <= 1e-4, round(d, 7))
    ref = hf_greedy(hf, PROMPTS)
    ar = RolloutEngine(lm).generate(PROMPTS, greedy()).tokens
    record(
        f"fp32 {case}: plain greedy == transformers generate()",
        ar == ref,
        sum(a == r for a, r in zip(ar, ref)),
        of=len(ref),
    )
    for name, drafter in drafters_for(lm, other, dev).items():
        out = RolloutEngine(lm, drafter, k=K).generate(PROMPTS, greedy())
        c = out.counters
        record(
            f"fp32 {case}: greedy speculative {name} k={K} == plain",
            out.tokens == ar,
            f"{c.num_accepted_tokens}/{c.num_draft_tokens} accepted",
        )
    # bfloat16: same checkpoint, speculative against plain with fixed_attention_length
    lm16 = LeanLM.from_hf(load_hf(path, torch.bfloat16).to(dev))
    lm16.fixed_attention_length = True
    ar16 = RolloutEngine(lm16).generate(PROMPTS, greedy()).tokens
    for name, drafter in drafters_for(lm16, None, dev).items():
        sv = RolloutEngine(lm16, drafter, k=K).generate(PROMPTS, greedy()).tokens
        first = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) if a != b else None
            for a, b in zip(sv, ar16)
        ]
        record(
            f"bf16 {case}: greedy speculative {name} k={K} == plain",
            None,
            "equal" if sv == ar16 else f"rows differ at {first}",
        )


def check_cuda_graphs(root: Path, dev: torch.device) -> None:
    hf = load_hf(make_checkpoint(root / "qwen3-graphs", "qwen3", 0)).to(dev)
    eager, graphed = LeanLM.from_hf(hf), LeanLM.from_hf(hf)
    graphed.enable_compile(cuda_graphs=dev.type == "cuda")
    d = max_diff(stepped_logits(graphed, SEQS, (1, 4)), stepped_logits(eager, SEQS, (1, 4)))
    record("compiled (CUDA graphs on cuda) qwen3: max |dlogit| vs eager", d <= 1e-4, round(d, 7))
    ar = RolloutEngine(eager).generate(PROMPTS, greedy()).tokens
    for name, drafter in [("plain", None), ("draft_model", DraftModelDrafter(graphed))]:
        out = RolloutEngine(graphed, drafter, k=K if drafter else 0).generate(PROMPTS, greedy()).tokens
        record(f"compiled qwen3: greedy {name} == eager plain", out == ar, "equal" if out == ar else "differs")


def _trained_chain(kind: str, lm: LeanLM, dev: torch.device):
    """An mtp/eagle3 head fitted 30 steps on the target's own sampled rollouts (as the CPU law tests)."""
    g = torch.Generator(device=dev).manual_seed(0)
    V = lm.cfg.vocab_size
    prompts = [[1, int(a), int(b)] for a, b in torch.randint(3, V, (64, 2), generator=torch.Generator().manual_seed(0))]
    out = RolloutEngine(lm).generate(prompts, SamplingParams(max_new_tokens=8, eos_token_id=EOS), g)
    seqs = [p + c for p, c in zip(prompts, out.tokens)]
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)  # (N, L) right-padded
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    mask = completion_loss_mask([3] * len(seqs), list(map(len, seqs)), L)
    counts = torch.bincount(ids.flatten(), minlength=V).float()
    rows = split_rows(lean_target_states(lm, ids.to(dev), mask.to(dev), (0, 1, 2)))
    fields = {"draft_vocab_size": 5} if kind == "eagle3" else {}  # q is 0 off its 5 ids: the sampler must stay exact
    d = build_drafter(kind, DrafterSpec(kind=kind, **fields), DrafterTarget(lm, token_counts=counts.to(dev)), dev)
    fit(d, rows, steps=30, lr=3e-3, batch_size=16)
    return d


def check_law(dev: torch.device, n_all: int) -> None:
    from scipy import stats

    hf = random_llama(vocab=8, hidden=32, seed=20, lm_head_std=0.6).to(dev)
    target = LeanLM.from_hf(hf)
    draft = LeanLM.from_hf(hf)
    with torch.no_grad():  # a draft close to the target: its LM head perturbed (tests/conftest.py perturbed_draft)
        draft.lm_head.weight.add_(
            0.4 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)).to(dev)
        )
    prompt, V = [1, 3, 4, 3, 4], 8
    sps = {
        "T=1": SamplingParams(temperature=1.0, max_new_tokens=3),
        "T=0.7 top-k 6 top-p 0.9": SamplingParams(temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=3),
    }
    cases = [
        ("draft_model", "T=1", DraftModelDrafter(draft)),
        ("draft_model", "T=0.7 top-k 6 top-p 0.9", DraftModelDrafter(draft)),
        ("ngram", "T=1", NgramDrafter(1, 2)),
        ("suffix", "T=1", SuffixDrafter()),
        ("mtp", "T=1", _trained_chain("mtp", target, dev)),
        ("eagle3", "T=1", _trained_chain("eagle3", target, dev)),
        ("eagle3", "T=0.7 top-k 6 top-p 0.9", _trained_chain("eagle3", target, dev)),
    ]
    for name, sp_name, drafter in cases:
        # suffix's trees are host-side Python per row
        sp, n = (
            sps[sp_name],
            min(n_all, 30_000) if name == "suffix" else n_all,
        )
        out = RolloutEngine(target, drafter, k=2, max_batch_size=n).generate(
            [prompt] * n, sp, torch.Generator(device=dev).manual_seed(1)
        )
        seqs = torch.tensor(out.tokens)  # (n, 3)
        cells = (seqs * (V ** torch.arange(2, -1, -1))).sum(1)
        expected = exact_joint(target, prompt, sp, 3).double().cpu() * n  # (512,)
        counts = torch.bincount(cells, minlength=V**3).double()
        impossible = int(counts[expected == 0].sum())
        big, small = expected >= 5, (expected < 5) & (expected > 0)
        obs = torch.cat([counts[big], counts[small].sum()[None]]).numpy()
        exp = torch.cat([expected[big], expected[small].sum()[None]]).numpy()
        if exp[-1] == 0:  # no small cells to pool
            obs, exp = obs[:-1], exp[:-1]
        p = float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
        c = out.counters
        record(
            f"law {name} {sp_name}: chi-square over 512 cells, n={n}",
            impossible == 0 and p > 1e-4 and c.num_accepted_tokens > 0,
            round(p, 4),
            accepted=f"{c.num_accepted_tokens}/{c.num_draft_tokens}",
            impossible=impossible,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=30_000, help="rollouts per law check (30,000 as the CPU suite)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"families, of {','.join(CASES)}")
    ap.add_argument(
        "--sections",
        default="graphs,law,families",
        help="which checks, in this order: graphs (compiles: ~100 s on an H100), law, families",
    )
    ap.add_argument("--out", default="cuda-parity.json")
    a = ap.parse_args()
    global OUT
    OUT = Path(a.out)
    dev = torch.device(a.device)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 parity means float32 GEMMs
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for section in a.sections.split(","):
            if section == "graphs":
                check_cuda_graphs(Path(tmp), dev)
            elif section == "law":
                check_law(dev, a.n)
            elif section == "families":
                for case in a.cases.split(","):
                    check_family(case, Path(tmp), dev)
            else:
                ap.error(f"--sections: unknown section {section!r} (allowed: graphs, law, families)")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    meta = {"device": name, "torch": torch.__version__, "seconds": round(time.perf_counter() - t0, 1), "n_law": a.n}
    OUT.write_text(json.dumps({"meta": meta, "results": RESULTS}, indent=1))
    failed = [r["check"] for r in RESULTS if r["ok"] is False]
    print(f"{len(RESULTS)} checks on {name} in {meta['seconds']} s: {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
