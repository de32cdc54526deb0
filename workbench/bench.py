"""`wb bench`: rollout-generation benchmark, measured side by side in one process.

Three tables, medians of ``repeats`` timed runs after one warm-up, fixed-length generation (EOS
ignored) so every contender produces the same number of tokens. The contenders of each row run
interleaved (ours, theirs, ours, theirs, ...), so load drifting on a shared machine hits both
alike; the speedups of table 3 pair each speculative run with an autoregressive one the same way:

1. ``ar``: our autoregressive engine vs transformers ``generate()`` at several batch sizes.
2. ``assisted``: our speculative engine (draft_model, k) vs transformers assisted generation
   (``assistant_model``, batch 1 — its only supported batch size) vs our autoregressive engine.
3. ``model``: per drafter and k at the GRPO batch size: measured α (fit to per-position
   acceptance, rate_i ≈ α^(i+1)), measured c (the drafter's seconds per verification step inside a
   real generation, per draft token, / target step), the target's forward cost as a function of
   tokens in flight, the speedup the Leviathan et al. (arXiv 2211.17192) model predicts per row
   with that cost curve, E[N] / (k·c + cost(k+1)/cost(1)), the same model over the batch's
   simulated step count (the slowest row sets it: :func:`batch_predicted_speedup`), the measured
   speedup and its ratio to the batch prediction (engine efficiency: what the engine's own
   overheads — sampling, rejection, bookkeeping — leave of the modelled speedup).

Speed is measured, never asserted: tests check the structure of the results, not their values.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from workbench.models import load_model, resolve_model
from workbench.models.tokenizer import encode_prompt
from workbench.perf.analytic import alpha_from_per_position, expected_tokens  # noqa: F401 (expected_tokens: part of the bench maths API)
from workbench.perf.analytic import gen_speedup as predicted_speedup  # Leviathan E[N] / (k·c + verify cost)
from workbench.perf.simulate import emit_pmf, simulate_steps, tokens_per_step
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams, probs_from_logits, sample
from workbench.specs import ExperimentSpec
from workbench.tasks.loading import load_task_data
from workbench.timing import TimeSpent, timed


@dataclass
class BenchConfig:
    batch_sizes: tuple[int, ...] = (1, 8, 64)
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    drafters: tuple[str, ...] = ("draft_model", "ngram")
    max_new_tokens: int = 64
    repeats: int = 3
    model_batch: int = 64  # the GRPO batch (prompts_per_step * group_size) for the model table
    hf: bool = True  # include transformers contenders
    compile: bool = False  # torch.compile our engine's forwards (RolloutEngine.enable_compile)


def fit_alpha(rates_per_pos: list[float]) -> float | None:
    """α fitted to per-position acceptance rates r_i ≈ α^(i+1) (:func:`workbench.perf.analytic.alpha_from_per_position`);
    None when no position was ever accepted."""
    return alpha_from_per_position(rates_per_pos) if any(r > 0 for r in rates_per_pos) else None


def batch_predicted_speedup(counters, rates: list[float], B: int, max_new_tokens: int, k: int, c: float, verify_cost: float) -> float | None:
    """Predicted speedup of a fixed-length batch: the Leviathan per-step cost (k·c + cost(k+1), in
    target steps) times the batch's verification steps S, against the autoregressive max_new_tokens-1.

    A batch runs until its slowest row has its tokens, so S is the expected *maximum* over the B
    rows of their steps, simulated from the measured per-position acceptance rates (and the share
    of row-steps without a draft, e.g. n-gram misses) with :func:`workbench.perf.simulate.simulate_steps`;
    per-row E[N] alone (Leviathan et al.) overstates a batch's speedup.
    """
    if counters.num_drafts == 0 or max_new_tokens < 2:
        return None
    emitted = counters.num_generated_tokens - B  # the prefill emits each row's first token
    undrafted = max(0.0, emitted - counters.num_drafts * tokens_per_step(rates))
    no_draft = undrafted / (counters.num_drafts + undrafted)
    S, _ = simulate_steps([max_new_tokens] * B, emit_pmf(rates, no_draft), reps=256)
    return (max_new_tokens - 1) / (S * (k * c + verify_cost))


def _paired_median(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device | None = None) -> dict[str, tuple[float, object]]:
    """Median seconds of each contender, run interleaved (A, B, A, B, ...) after one warm-up each,
    so that load drifting on a shared machine hits every contender alike (side by side); each call
    timed by :func:`workbench.timing.timed` (``device`` synchronised around it)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            dt, outs[name] = timed(fn, device)
            times[name].append(dt)
    return {name: (statistics.median(times[name]), outs[name]) for name in fns}


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids, mask


@dataclass
class Bench:
    spec: ExperimentSpec
    cfg: BenchConfig
    results: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        torch.manual_seed(self.spec.seed)
        self.target_path = resolve_model(self.spec.model.target, what="model.target")
        self.hf_target, self.tok = load_model(self.target_path)
        self.target = LeanLM.from_hf(self.hf_target, what="model.target")
        if self.cfg.compile:
            self.target.enable_compile()
        self.hf_draft, _ = load_model(resolve_model(self.spec.drafter.model, what="drafter.model"))
        r = self.spec.rollout
        self.sp = SamplingParams(r.temperature, r.top_p, r.top_k, self.cfg.max_new_tokens, None)  # EOS ignored
        n = max(max(self.cfg.batch_sizes), self.cfg.model_batch)
        rows = list(load_task_data(self.spec.task.name, "eval", n, self.spec.seed)["prompt"])
        self.prompts = [encode_prompt(self.tok, p) for p in (rows * (n // max(len(rows), 1) + 1))[:n]]

    @property
    def device(self) -> torch.device:
        """Where the target runs (the CPU: every contender is built there), synchronised around each timing."""
        return self.target.lm_head.weight.device

    def _engine(self, kind: str, k: int) -> RolloutEngine:
        from workbench.drafter_init import drafter_as_run

        ds = self.spec.drafter.model_copy(update={"kind": kind, "k": k})
        drafter = drafter_as_run(self.spec.model_copy(update={"drafter": ds}), self.target, self.tok, self.target_path, torch.device("cpu"))
        eng = RolloutEngine(self.target, drafter, k=k)
        if self.cfg.compile:
            eng.enable_compile()
        return eng

    def _ours(self, engine: RolloutEngine, prompts):
        return lambda: engine.generate(prompts, self.sp, torch.Generator().manual_seed(0))

    def _hf(self, prompts, assistant=None, k: int = 0):
        ids, mask = _left_pad(prompts, self.tok.pad_token_id)
        kw = dict(max_new_tokens=self.cfg.max_new_tokens, min_new_tokens=self.cfg.max_new_tokens, pad_token_id=self.tok.pad_token_id)
        if self.sp.greedy:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=self.sp.temperature, top_p=self.sp.top_p, top_k=self.sp.top_k or None)
        if assistant is not None:
            assistant.generation_config.num_assistant_tokens = k
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.0
            kw["assistant_model"] = assistant
        return lambda: self.hf_target.generate(input_ids=ids, attention_mask=mask, **kw)

    # ------------------------------------------------------------------ tables

    @torch.no_grad()
    def run_ar(self) -> list[dict]:
        rows = []
        for B in self.cfg.batch_sizes:
            prompts = self.prompts[:B]
            n_tok = B * self.cfg.max_new_tokens
            fns = {"ours": self._ours(RolloutEngine(self.target), prompts)}
            if self.cfg.hf:
                fns["hf"] = self._hf(prompts)
            t = _paired_median(fns, self.cfg.repeats, self.device)
            row = {"batch": B, "ours_tok_s": n_tok / t["ours"][0]}
            if self.cfg.hf:
                row.update(hf_generate_tok_s=n_tok / t["hf"][0], ratio=t["hf"][0] / t["ours"][0])
            rows.append(row)
        return rows

    @torch.no_grad()
    def run_assisted(self) -> list[dict]:
        prompts = self.prompts[:1]
        n_tok = self.cfg.max_new_tokens
        ar = self._ours(RolloutEngine(self.target), prompts)
        rows = []
        for k in self.cfg.ks:
            fns = {"spec": self._ours(self._engine("draft_model", k), prompts), "ar": ar}
            if self.cfg.hf:
                fns["assisted"] = self._hf(prompts, assistant=self.hf_draft, k=k)
            t = _paired_median(fns, self.cfg.repeats, self.device)
            t_spec, out = t["spec"]
            row = {"k": k, "ours_spec_tok_s": n_tok / t_spec, "ours_ar_tok_s": n_tok / t["ar"][0],
                   "acceptance_length": out.counters.metrics().get("spec/acceptance_length")}
            if self.cfg.hf:
                row.update(hf_assisted_tok_s=n_tok / t["assisted"][0], ratio=t["assisted"][0] / t_spec)
            rows.append(row)
        return rows

    @torch.no_grad()
    def step_costs(self, B: int, max_t: int) -> dict:
        """Median seconds of one target forward with T = 1..max_t tokens per row (+ sampling), and
        of one draft-model step (T = 1), at batch B over a ~prompt-length cache."""
        ctx = 48
        def target_fwd(T):
            cache = self.target.new_cache(B, ctx + max_t + 1)
            x = torch.randint(3, self.target.cfg.vocab_size, (B, T))
            start = torch.full((B,), ctx)
            return lambda: probs_from_logits(self.target(x, start, cache)[0], self.sp)
        draft = LeanLM.from_hf(self.hf_draft, what="drafter.model")
        if self.cfg.compile:
            draft.enable_compile()
        dcache = draft.new_cache(B, ctx + 2)
        x1 = torch.randint(3, draft.cfg.vocab_size, (B, 1))
        start = torch.full((B,), ctx)
        draft_step = lambda: sample(probs_from_logits(draft(x1, start, dcache)[0][:, 0], self.sp))  # noqa: E731
        # every point of the curve and the draft step interleaved: drift on a shared machine moves
        # them together instead of bending the curve
        t = _paired_median({**{T: target_fwd(T) for T in range(1, max_t + 1)}, "draft": draft_step}, max(self.cfg.repeats, 5) * 3, self.device)
        return {"target_curve_s": {T: t[T][0] for T in range(1, max_t + 1)}, "draft_step_s": t["draft"][0]}

    @torch.no_grad()
    def run_model(self) -> dict:
        B = self.cfg.model_batch
        prompts = self.prompts[:B]
        costs = self.step_costs(B, max(self.cfg.ks) + 1)
        t1 = costs["target_curve_s"][1]
        ar = self._ours(RolloutEngine(self.target), prompts)
        ar_times = []
        rows = []
        for kind in self.cfg.drafters:
            for k in self.cfg.ks:
                eng = self._engine(kind, k)
                t = _paired_median({"spec": self._ours(eng, prompts), "ar": ar}, self.cfg.repeats, self.device)  # speedup side by side
                (t_spec, out), t_ar = t["spec"], t["ar"][0]
                ar_times.append(t_ar)
                m = out.counters.metrics()
                rates = [m[f"spec/acceptance_rate_pos_{i}"] for i in range(k) if f"spec/acceptance_rate_pos_{i}" in m]
                alpha = fit_alpha(rates)
                # c: the drafter's seconds per verification step inside a real generation (propose +
                # accept, every kind alike), per draft token, in target steps
                c = self._drafter_cost(eng, prompts) / t1 / k
                verify = costs["target_curve_s"][k + 1] / t1
                per_row = predicted_speedup(alpha, k, c, verify) if alpha is not None else None
                pred = batch_predicted_speedup(out.counters, rates, B, self.cfg.max_new_tokens, k, c, verify)
                meas = t_ar / t_spec
                rows.append({
                    "drafter": kind, "k": k, "alpha": alpha, "c": c, "verify_cost": verify,
                    "acceptance_length": m.get("spec/acceptance_length"), "predicted_per_row": per_row,
                    "predicted_speedup": pred, "measured_speedup": meas, "efficiency": (meas / pred) if pred else None,
                })
        return {"batch": B, "ar_gen_s": statistics.median(ar_times) if ar_times else None, "costs": {"target_curve_s": costs["target_curve_s"], "draft_step_s": costs["draft_step_s"]}, "rows": rows}

    def _drafter_cost(self, eng: RolloutEngine, prompts) -> float:
        """Seconds the drafter spends per verification step (propose + accept), timed inside a real
        generation at this batch (EOS ignored, so the batch stays full); median over repeats."""
        d = eng.drafter
        spent = TimeSpent(self.device)
        d.propose, d.accept = spent.wrap(d.propose), spent.wrap(d.accept)
        try:
            per_step = []
            for _ in range(max(self.cfg.repeats, 3)):
                spent.seconds = 0.0
                out = eng.generate(prompts, self.sp, torch.Generator().manual_seed(0))
                per_step.append(spent.seconds / max(out.counters.num_verify_steps, 1))
        finally:
            del d.propose, d.accept
        return statistics.median(per_step)

    def run(self, progress: Callable[[str], None] = lambda s: None) -> dict:
        progress("autoregressive vs transformers generate()")
        self.results["ar"] = self.run_ar()
        progress("speculative vs transformers assisted generation")
        self.results["assisted"] = self.run_assisted()
        progress("performance model per drafter and k")
        self.results["model"] = self.run_model()
        self.results["meta"] = machine_info() | {
            "target": self.spec.model.target, "draft": self.spec.drafter.model, "max_new_tokens": self.cfg.max_new_tokens,
            "repeats": self.cfg.repeats, "compile": self.cfg.compile, "sampling": {"temperature": self.sp.temperature, "top_p": self.sp.top_p, "top_k": self.sp.top_k},
        }
        return self.results


def machine_info() -> dict:
    dev = "cuda: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "device": dev, "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


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


def to_markdown(r: dict) -> str:
    meta = r.get("meta", {})
    lines = [f"# wb bench — {meta.get('device', '?')} ({meta.get('date', '')})", "", f"Command: `{r.get('command', '')}`", "",
             f"target `{meta.get('target')}`, draft `{meta.get('draft')}`, {meta.get('max_new_tokens')} new tokens per sequence (EOS ignored), "
             f"median of {meta.get('repeats')} runs interleaved with the row's contender, torch {meta.get('torch')} with {meta.get('torch_threads')} threads on {meta.get('cpu_count')} cores"
             f"{'; our engine torch.compile-d (compilation in the untimed warm-up)' if meta.get('compile') else ''}.", ""]
    lines += ["## Autoregressive: ours vs transformers generate()", "", "| batch | ours tok/s | transformers tok/s | ours / transformers |", "|---|---|---|---|"]
    for x in r.get("ar", []):
        lines.append(f"| {x['batch']} | {_f(x['ours_tok_s'], 0)} | {_f(x.get('hf_generate_tok_s'), 0)} | {_f(x.get('ratio'))} |")
    lines += ["", "## Speculative (draft_model), batch 1: ours vs transformers assisted generation", "",
              "| k | ours spec tok/s | ours AR tok/s | transformers assisted tok/s | ours / assisted | acceptance length |", "|---|---|---|---|---|---|"]
    for x in r.get("assisted", []):
        lines.append(f"| {x['k']} | {_f(x['ours_spec_tok_s'], 0)} | {_f(x['ours_ar_tok_s'], 0)} | {_f(x.get('hf_assisted_tok_s'), 0)} | {_f(x.get('ratio'))} | {_f(x['acceptance_length'])} |")
    m = r.get("model", {})
    if m:
        curve = m["costs"]["target_curve_s"]
        t1 = curve[1] if 1 in curve else curve["1"]
        lines += ["", f"## Performance model at batch {m['batch']} (Leviathan et al. with the measured verification cost)", "",
                  "Target forward cost vs tokens per row (relative to 1): " + ", ".join(f"{T}: {v / t1:.2f}" for T, v in curve.items()), "",
                  "c: drafter seconds per draft token inside a real generation / one target step; predicted per row: "
                  "E[N] / (k·c + verify cost); predicted: the same step cost over the batch's simulated steps (the "
                  "slowest of the rows sets them); efficiency = measured / predicted.", "",
                  "| drafter | k | α | c | verify cost | acc. length | predicted per row | predicted | measured | efficiency |", "|---|---|---|---|---|---|---|---|---|---|"]
        for x in m["rows"]:
            lines.append(f"| {x['drafter']} | {x['k']} | {_f(x['alpha'])} | {_f(x['c'])} | {_f(x['verify_cost'])} | {_f(x['acceptance_length'])} | "
                         f"{_f(x.get('predicted_per_row'))} | {_f(x['predicted_speedup'])} | {_f(x['measured_speedup'])} | {_f(x['efficiency'])} |")
    return "\n".join(lines) + "\n"
