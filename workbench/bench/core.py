"""`wb bench`: rollout-generation benchmark, measured side by side in one process.

Three tables, medians of ``repeats`` timed runs after one warm-up, fixed-length generation (EOS
ignored) so every contender produces the same number of tokens. The contenders of each row run
interleaved (ours, theirs, ours, theirs, ...), so load drifting on a shared machine hits both
alike; the speedups of table 3 pair each speculative run with an autoregressive one the same way:

1. ``ar``: our autoregressive engine vs transformers ``generate()`` at several batch sizes, plain
   and at its strongest settings (static KV cache + ``torch.compile``: :mod:`workbench.bench.hf`).
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

Every contender (our target and drafters, transformers' models, prompts, generators, the step-cost
inputs) lives on ``model.device`` in ``model.dtype``. On CUDA each contender's peak memory is
recorded too (:func:`measure`). Speed is measured, never asserted: tests check the structure of the
results, not their values.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from workbench import metrics as M
from workbench.bench.hf import COMPILE_SETTINGS, first_working, hf_generate, setting_name, static_kwargs
from workbench.bench.machine import draft_label, machine_info
from workbench.grpo.build import resolve_device
from workbench.models import load_model, resolve_model
from workbench.models.chat import run_prompt_format
from workbench.perf.steps import batch_predicted_speedup
from workbench.rollout.cost import fit_alpha, gen_speedup
from workbench.rollout.graphs import capture_sizes, cudagraph_skips
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import probs_from_logits, sample
from workbench.rollout.workbench_backend import WorkbenchBackend
from workbench.rollout_builder import EngineConfig, plain_backend, workbench_backend
from workbench.specs import ExperimentSpec
from workbench.specs.resolve import rollout_config
from workbench.stats import RatioCI, paired_ratios, ratio_ci
from workbench.tags import TAG_ENGINE_PATH
from workbench.tasks.loading import load_task_data
from workbench.timing import TimeSpent, Timing, measure, timed  # noqa: F401 (Timing: part of the bench API)


@dataclass
class BenchConfig:
    batch_sizes: tuple[int, ...] = (1, 8, 64)
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    drafters: tuple[str, ...] = ("draft_model", "ngram")
    max_new_tokens: int = 64
    repeats: int = 3
    model_batch: int = 64  # the GRPO batch (prompts_per_step * group_size) for the model table
    hf: bool = True  # include transformers contenders
    compile: bool = False  # torch.compile our engine's forwards (WorkbenchBackend's compile)
    hf_compile: bool | None = None  # compile transformers' static-cache generate(); None: on CUDA only
    # our forwards as CUDA graphs (implies compile; rollout.cuda_graphs, workbench.rollout.graphs)
    cuda_graphs: bool = False
    vllm: str | None = None  # drafter kind of the vLLM table (workbench.vllm.measure.bench); None = no vLLM contenders
    only_vllm: bool = False  # the vLLM table alone
    # with vllm: vLLM's cost runs and its speedup predicted from ours' acceptance
    # (workbench.vllm.measure.bench_transfer)
    transfer: bool = True
    # with vllm: settings vLLM cannot run (suffix, adaptive), predicted from its cost runs
    vllm_predict: tuple[str, ...] = ()


def _paired_median(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    device: torch.device | None = None,
    first_peaks: dict[str, float | None] | None = None,
) -> dict[str, Timing]:
    """Median seconds of each contender, run interleaved (A, B, A, B, ...) after one warm-up each,
    so that load drifting on a shared machine hits every contender alike (side by side); each call
    timed by :func:`measure` (``device`` synchronised around it). The peak memory is the largest of
    the warm-up and timed calls and of ``first_peaks`` (a contender's earlier first call): a
    compiled contender allocates its CUDA graphs in its first call."""
    peaks: dict[str, list[float | None]] = {name: [measure(fn, device).peak_mib] for name, fn in fns.items()}
    for name, peak in (first_peaks or {}).items():
        if name in peaks and peak is not None:
            peaks[name].append(peak)
    times: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            m = measure(fn, device)
            times[name].append(m.seconds)
            peaks[name].append(m.peak_mib)
            outs[name] = m.out
    return {
        name: Timing(
            statistics.median(times[name]),
            outs[name],
            None if peaks[name][0] is None else max(p for p in peaks[name] if p is not None),
            tuple(times[name]),
        )
        for name in fns
    }


def paired_speedup_ci(ar: Timing, spec: Timing) -> RatioCI:
    """The speedup ar / spec over the interleaved repeats (repeat i of each is a pair, timed side by
    side): geometric mean and Student-t 95 % interval on the log ratios (docs/design.md §8)."""
    return ratio_ci(paired_ratios(ar.all_s, spec.all_s))


@dataclass
class Bench:
    """The benchmark of ``spec`` (target, draft model, task prompts, sampling, ``model.device`` and
    ``model.dtype``) with the tables of ``cfg``; :meth:`run` fills and returns ``results``.

    Raises (on construction):
        ValueError: an unknown preset or unreadable checkpoint folder (names model.target or
            drafter.model), an unavailable CUDA device (names model.device), an unknown dtype.
    """

    spec: ExperimentSpec
    cfg: BenchConfig
    results: dict = field(default_factory=dict)
    engine_paths: set[str] = field(default_factory=set)  # our engines' forward paths (TAG_ENGINE_PATH), for the header

    def __post_init__(self) -> None:
        torch.manual_seed(self.spec.seed)
        self._device = resolve_device(self.spec.model.device)
        self.hf_compile = self._device.type == "cuda" if self.cfg.hf_compile is None else self.cfg.hf_compile
        dev, dtype = str(self._device), self.spec.model.dtype
        self.target_path = resolve_model(self.spec.model.target, what="model.target")
        self.hf_target, self.tok = load_model(self.target_path, device=dev, dtype=dtype)
        self.target = LeanLM.from_hf(self.hf_target, what="model.target")
        if self.cfg.cuda_graphs and self.device.type != "cuda":
            raise ValueError(
                f"--cuda-graphs: CUDA graphs need a CUDA device, not {self.device}; drop --cuda-graphs or use "
                "--device cuda"
            )
        if self.cfg.compile or self.cfg.cuda_graphs:
            self.target.enable_compile(self.cfg.cuda_graphs)
        self.hf_draft, _ = load_model(
            resolve_model(self.spec.drafter.model, what="drafter.model"), device=dev, dtype=dtype
        )
        self.sp = rollout_config(self.spec, max_new_tokens=self.cfg.max_new_tokens).sampling  # no tokenizer: EOS off
        n = max(max(self.cfg.batch_sizes), self.cfg.model_batch)
        rows = list(load_task_data(self.spec.task.name, "eval", n, self.spec.seed)["prompt"])
        fmt = run_prompt_format(self.spec.task, self.tok)  # as a run feeds them: chat-templated for a chat model
        self.prompts = [fmt.encode(p) for p in (rows * (n // max(len(rows), 1) + 1))[:n]]

    @property
    def device(self) -> torch.device:
        """Where every contender runs (``model.device`` resolved), synchronised around each timing."""
        return self._device

    def _ar_engine(self) -> WorkbenchBackend:
        """Our autoregressive engine (with CUDA graphs: the batch shrinking only to capture sizes; with
        ``rollout.prepack_weights``, as every engine of the bench, its weights packed for oneDNN)."""
        return self._noted(
            plain_backend(
                self.target,
                EngineConfig(
                    retire_buckets=capture_sizes(256) if self.cfg.cuda_graphs else None,
                    compile=self.cfg.compile or self.cfg.cuda_graphs,
                    cuda_graphs=self.cfg.cuda_graphs,
                    prepack=self.spec.rollout.prepack_weights,
                ),
            )
        )

    def _noted(self, backend: WorkbenchBackend) -> WorkbenchBackend:
        """``backend``, its forward path (eager / packed weights / compiled) noted for the header."""
        self.engine_paths.add(backend.tags.get(TAG_ENGINE_PATH, "?"))
        return backend

    def _engine(self, kind: str, k: int, **fields) -> WorkbenchBackend:
        """Our speculative engine with drafter ``kind`` at ``k`` (other ``drafter.*`` fields: ``fields``)."""
        from workbench.drafter_init import drafter_as_run
        from workbench.specs.resolve import drafter_init_config

        ds = self.spec.drafter.model_copy(update={"kind": kind, "k": k, **fields})
        init = drafter_init_config(self.spec.model_copy(update={"drafter": ds}))
        drafter = drafter_as_run(init, self.target, self.tok, self.target_path, self.device)
        engine = EngineConfig(
            compile=self.cfg.compile or self.cfg.cuda_graphs,
            cuda_graphs=self.cfg.cuda_graphs,
            prepack=self.spec.rollout.prepack_weights,
        )
        return self._noted(workbench_backend(self.target, drafter, k, engine))

    def _ours(self, engine: WorkbenchBackend, prompts):
        return lambda: engine.generate(prompts, self.sp, torch.Generator(self.device).manual_seed(0))

    def _hf(self, prompts, extra: dict | None = None, assistant=None, k: int = 0):
        return hf_generate(
            self.hf_target,
            prompts,
            self.tok.pad_token_id,
            self.sp,
            self.cfg.max_new_tokens,
            self.device,
            extra=extra,
            assistant=assistant,
            k=k,
        )

    def _hf_contenders(self, prompts) -> tuple[dict[str, Callable[[], object]], dict, dict[str, float | None]]:
        """transformers' autoregressive contenders at this batch, each run once (compiling it):
        ``hf_generate`` (plain ``generate()``) and ``hf_static`` (static cache, compiled when
        ``hf_compile``: the first setting of :data:`workbench.bench.hf.COMPILE_SETTINGS` that runs,
        else uncompiled); the info names the static setting used and the errors of those that failed;
        the peaks are those of the first calls (MiB, None off CUDA)."""
        settings = [*(COMPILE_SETTINGS if self.hf_compile else ()), None]
        timer = lambda fn: measure(fn, self.device)  # noqa: E731
        _, plain, errors, t_plain = first_working([("generate()", lambda: self._hf(prompts))], self.device, timer)
        static_name, static, static_errors, t_static = first_working(
            [(setting_name(s), lambda s=s: self._hf(prompts, extra=static_kwargs(s, self.device))) for s in settings],
            self.device,
            timer,
        )
        fns = {n: f for n, f in (("hf_generate", plain), ("hf_static", static)) if f is not None}
        peaks = {n: t.peak_mib for n, t in (("hf_generate", t_plain), ("hf_static", t_static)) if t is not None}
        return fns, {"hf_static_setting": static_name, "hf_errors": errors | static_errors}, peaks

    # ------------------------------------------------------------------ tables

    @torch.no_grad()
    def run_ar(self) -> list[dict]:
        """Rows per batch size: tokens/s of ours, of transformers' generate() plain and static, peak
        memory of each (MiB; None off CUDA), ``ratio`` = ours / the best transformers contender and
        ``ratio_generate`` = ours / plain generate() (speed ratios; None without transformers)."""
        rows = []
        for B in self.cfg.batch_sizes:
            prompts = self.prompts[:B]
            n_tok = B * self.cfg.max_new_tokens
            fns = {"ours": self._ours(self._ar_engine(), prompts)}
            row: dict = {"batch": B}
            first: dict = {}
            if self.cfg.hf:
                hf_fns, info, first = self._hf_contenders(prompts)
                fns |= hf_fns
                row |= info
            t = _paired_median(fns, self.cfg.repeats, self.device, first)
            ours = t["ours"].seconds
            row.update(ours_tok_s=n_tok / ours, ours_peak_mib=t["ours"].peak_mib)
            if self.cfg.hf:
                for name in ("hf_generate", "hf_static"):
                    row[f"{name}_tok_s"] = n_tok / t[name].seconds if name in t else None
                    row[f"{name}_peak_mib"] = t[name].peak_mib if name in t else None
                best = min((t[n].seconds for n in ("hf_generate", "hf_static") if n in t), default=None)
                row["ratio"] = best / ours if best is not None else None
                row["ratio_generate"] = t["hf_generate"].seconds / ours if "hf_generate" in t else None
            rows.append(row)
        return rows

    @torch.no_grad()
    def run_assisted(self) -> list[dict]:
        """Rows per k at batch 1: ours speculative (draft_model) and autoregressive, transformers
        assisted generation (``hf_assisted_error`` if it raised), tokens/s and peak memory (MiB)."""
        prompts = self.prompts[:1]
        n_tok = self.cfg.max_new_tokens
        ar = self._ours(self._ar_engine(), prompts)
        rows = []
        for k in self.cfg.ks:
            fns = {"spec": self._ours(self._engine("draft_model", k), prompts), "ar": ar}
            errors: dict = {}
            first: dict = {}
            if self.cfg.hf:
                _, assisted, errors, t0 = first_working(
                    [("assisted", lambda: self._hf(prompts, assistant=self.hf_draft, k=k))],
                    self.device,
                    lambda fn: measure(fn, self.device),
                )
                if assisted is not None:
                    fns["assisted"], first["assisted"] = assisted, t0.peak_mib
            t = _paired_median(fns, self.cfg.repeats, self.device, first)
            t_spec = t["spec"].seconds
            row = {
                "k": k,
                "ours_spec_tok_s": n_tok / t_spec,
                "ours_ar_tok_s": n_tok / t["ar"].seconds,
                "acceptance_length": t["spec"].out.counters.metrics().get(M.ACCEPTANCE_LENGTH),
                "ours_spec_peak_mib": t["spec"].peak_mib,
            }
            if self.cfg.hf:
                a = t.get("assisted")
                row.update(
                    hf_assisted_tok_s=n_tok / a.seconds if a else None,
                    ratio=a.seconds / t_spec if a else None,
                    hf_assisted_peak_mib=a.peak_mib if a else None,
                    hf_assisted_error=errors.get("assisted"),
                )
            rows.append(row)
        return rows

    @torch.no_grad()
    def step_costs(self, B: int, max_t: int) -> dict:
        """Median seconds of one target forward with T = 1..max_t tokens per row (+ sampling), and
        of one draft-model step (T = 1), at batch B over a ~prompt-length cache, on the bench's device."""
        ctx, dev = 48, self.device

        def target_fwd(T):
            cache = self.target.new_cache(B, ctx + max_t + 1)
            x = torch.randint(3, self.target.cfg.vocab_size, (B, T), device=dev)
            start = torch.full((B,), ctx, device=dev)
            return lambda: probs_from_logits(self.target(x, start, cache)[0], self.sp)

        draft = LeanLM.from_hf(self.hf_draft, what="drafter.model")
        if self.cfg.compile or self.cfg.cuda_graphs:
            draft.enable_compile(self.cfg.cuda_graphs)
        dcache = draft.new_cache(B, ctx + 2)
        x1 = torch.randint(3, draft.cfg.vocab_size, (B, 1), device=dev)
        start = torch.full((B,), ctx, device=dev)
        gen = torch.Generator(dev).manual_seed(0)
        draft_step = lambda: sample(probs_from_logits(draft(x1, start, dcache)[0][:, 0], self.sp), gen)  # noqa: E731
        # every point of the curve and the draft step interleaved: drift on a shared machine moves
        # them together instead of bending the curve
        t = _paired_median(
            {**{T: target_fwd(T) for T in range(1, max_t + 1)}, "draft": draft_step}, max(self.cfg.repeats, 5) * 3, dev
        )
        return {"target_curve_s": {T: t[T].seconds for T in range(1, max_t + 1)}, "draft_step_s": t["draft"].seconds}

    @torch.no_grad()
    def run_model(self) -> dict:
        B = self.cfg.model_batch
        prompts = self.prompts[:B]
        costs = self.step_costs(B, max(self.cfg.ks) + 1)
        t1 = costs["target_curve_s"][1]
        ar = self._ours(self._ar_engine(), prompts)
        ar_times, ar_peaks = [], []
        rows = []
        for kind in self.cfg.drafters:
            for k in self.cfg.ks:
                eng = self._engine(kind, k)
                # speedup side by side
                t = _paired_median({"spec": self._ours(eng, prompts), "ar": ar}, self.cfg.repeats, self.device)
                t_spec, out, t_ar = t["spec"].seconds, t["spec"].out, t["ar"].seconds
                ar_times.append(t_ar)
                ar_peaks.append(t["ar"].peak_mib)
                m = out.counters.metrics()
                rates = [m[M.acceptance_rate_pos(i)] for i in range(k) if M.acceptance_rate_pos(i) in m]
                alpha = fit_alpha(rates)
                # c: the drafter's seconds per verification step inside a real generation (propose +
                # accept, every kind alike), per draft token, in target steps
                c = self._drafter_cost(eng, prompts) / t1 / k
                verify = costs["target_curve_s"][k + 1] / t1
                # Leviathan E[N] / (k·c + verify cost)
                per_row = gen_speedup(alpha, k, c, verify) if alpha is not None else None
                pred = batch_predicted_speedup(out.counters, rates, B, self.cfg.max_new_tokens, k, c, verify)
                meas = t_ar / t_spec
                ci = paired_speedup_ci(t["ar"], t["spec"])
                rows.append(
                    {
                        "drafter": kind,
                        "k": k,
                        "alpha": alpha,
                        "c": c,
                        "verify_cost": verify,
                        "acceptance_length": m.get(M.ACCEPTANCE_LENGTH),
                        "predicted_per_row": per_row,
                        "predicted_speedup": pred,
                        "measured_speedup": meas,
                        "efficiency": (meas / pred) if pred else None,
                        "speedup_mean": ci.mean,
                        "speedup_ci95_low": ci.low,
                        "speedup_ci95_high": ci.high,
                        "repeats": ci.n,
                        "spec_tok_s": B * self.cfg.max_new_tokens / t_spec,
                        "spec_peak_mib": t["spec"].peak_mib,
                    }
                )
        ar_gen_s = statistics.median(ar_times) if ar_times else None
        return {
            "batch": B,
            "ar_gen_s": ar_gen_s,
            "ar_tok_s": B * self.cfg.max_new_tokens / ar_gen_s if ar_gen_s else None,
            "ar_peak_mib": max(ar_peaks) if ar_peaks and ar_peaks[0] is not None else None,
            "costs": {"target_curve_s": costs["target_curve_s"], "draft_step_s": costs["draft_step_s"]},
            "rows": rows,
        }

    def _drafter_cost(self, eng: WorkbenchBackend, prompts) -> float:
        """Seconds the drafter spends per verification step (propose + accept), timed inside a real
        generation at this batch (EOS ignored, so the batch stays full); median over repeats."""
        d = eng.drafter
        spent = TimeSpent(self.device)
        d.propose, d.accept = spent.wrap(d.propose), spent.wrap(d.accept)
        try:
            per_step = []
            for _ in range(max(self.cfg.repeats, 3)):
                spent.seconds = 0.0
                out = eng.generate(prompts, self.sp, torch.Generator(self.device).manual_seed(0))
                per_step.append(spent.seconds / max(out.counters.num_verify_steps, 1))
        finally:
            del d.propose, d.accept
        return statistics.median(per_step)

    def run(self, progress: Callable[[str], None] = lambda s: None) -> dict:
        resident = torch.cuda.memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None
        if not self.cfg.only_vllm:
            progress("autoregressive vs transformers generate()")
            self.results["ar"] = self.run_ar()
            progress("speculative vs transformers assisted generation")
            self.results["assisted"] = self.run_assisted()
            progress("performance model per drafter and k")
            self.results["model"] = self.run_model()
        vllm_meta = {}
        if self.cfg.vllm:
            from workbench.vllm.measure import run_vllm
            from workbench.vllm.runtime import build_id

            progress(f"ours vs vLLM (plain; greedy speculative {self.cfg.vllm})")
            self.results["vllm"] = run_vllm(
                self, self.cfg.vllm, self.spec.drafter.k, transfer=self.cfg.transfer, predict=self.cfg.vllm_predict
            )
            b = build_id(self.spec.rollout.vllm.cpu_expand_fix)
            vllm_meta = {"vllm": f"vllm {b['vllm']} ({b['platform']})"}
        self.results["meta"] = machine_info(self.device) | {
            "target": self.spec.model.target,
            "draft": draft_label(self.spec.drafter),
            "max_new_tokens": self.cfg.max_new_tokens,
            "repeats": self.cfg.repeats,
            "compile": self.cfg.compile,
            "cuda_graphs": self.cfg.cuda_graphs,
            "engine_path": "; ".join(sorted(self.engine_paths)) or None,
            "cudagraph_skips": cudagraph_skips() if self.cfg.cuda_graphs else None,
            "hf_compile": self.hf_compile,
            "dtype": self.spec.model.dtype,
            "resident_mib": resident,
            "sampling": {"temperature": self.sp.temperature, "top_p": self.sp.top_p, "top_k": self.sp.top_k},
            **vllm_meta,
        }
        return self.results
