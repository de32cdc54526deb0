"""Batched rollout engine: autoregressive and exact speculative generation over one KV cache.

One code path for CPU and CUDA. A batch of prompts is prefilled once; then every step either
decodes one token per row (no drafter) or verifies k drafts per row in one target forward and
emits each row's own number of tokens (ragged acceptance, docs/design.md §4). Rows that finish leave
the batch (the cache and the drafter drop them, compacting their caches in place: ``KVCache.select``),
so no row waits for or is cut back to another. With more prompts than ``max_batch_size`` the
engine batches continuously (Orca, Yu et al. OSDI 2022; vLLM's scheduler): prompts waiting in the
queue are prefilled into the slots finished rows left, so a batch's long tail decodes beside new
rows instead of alone.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from workbench.rollout.batch import BatchState, collect, compact_order, to_device
from workbench.rollout.counters import SpecCounters
from workbench.rollout.drafter import Drafter
from workbench.rollout.graphs import capture_sizes, round_cache_len
from workbench.rollout.keyed import keyed_sample, keyed_verify, row_seeds
from workbench.rollout.kpolicy import KPolicy
from workbench.rollout.model import LeanLM
from workbench.rollout.prefix import PromptStore, prefill_shared
from workbench.rollout.rejection import rejection_sample
from workbench.rollout.sampling import SamplingParams, is_stop, probs_from_logits, sample


@dataclass
class RolloutOutput:
    """Per sequence: completion ids (EOS included when emitted), their log p under the processed
    distribution, and the finish reason ("stop" = EOS, "length" = max_new_tokens)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    counters: SpecCounters
    extra: dict[str, Any] = field(default_factory=dict)


class RolloutEngine:
    """Generates completions from the target, optionally speculating with ``drafter``.

    Args:
        target: the rollout copy of the policy (weights synced in `prepare` via ``load_weights``).
        drafter: a :class:`drafters.Drafter` or None for plain autoregressive decoding.
        k: num_speculative_tokens (ignored without a drafter); with ``k_policy``, the largest k_t.
        max_batch_size: rows decoded together; more prompts are processed in chunks.
        k_policy: chooses k_t in 0..k before each step (:class:`workbench.rollout.kpolicy.KPolicy`,
            adaptive speculation); None = k every step.
        retire_buckets: batch sizes the batch may shrink to (ascending), e.g. (1, 2, 4, ..., 256)
            for CUDA graphs captured per batch size (vLLM's capture sizes): finished rows then stay
            in the batch, emitting nothing, until the live rows fit the next smaller size. None =
            finished rows leave at once.
        continuous: continuous batching (``rollout.continuous_batching``): with more prompts than
            ``max_batch_size``, waiting prompts join the batch as rows finish; False = consecutive
            chunks of ``max_batch_size`` prompts, each decoded to its last row.

    The hot loop reads the device once per step: one packed vector (which rows finished, the
    longest row, the step's acceptance counts) that the batch's bookkeeping needs on the host.
    Everything else (writes, counters, masks) stays on the device, so on CUDA the host queues the
    next step's kernels without waiting elsewhere (``tests/test_engine_hot_loop.py`` counts).
    """

    def __init__(
        self,
        target: LeanLM,
        drafter: Drafter | None = None,
        k: int = 3,
        max_batch_size: int = 256,
        k_policy: KPolicy | None = None,
        retire_buckets: tuple[int, ...] | None = None,
        continuous: bool = True,
    ):
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.max_batch_size = max_batch_size
        self.k_policy = k_policy if drafter is not None else None
        self.retire_buckets = tuple(sorted(retire_buckets)) if retire_buckets else None
        self.continuous = continuous

    def enable_compile(self, cuda_graphs: bool = False) -> None:
        """``torch.compile`` the target's decode/verify forwards, and the draft model's if there is
        one; ``cuda_graphs``: as CUDA graphs, the batch shrinking only to capture sizes
        (:mod:`workbench.rollout.graphs`)."""
        self.target.enable_compile(cuda_graphs)
        draft = getattr(self.drafter, "model", None)
        if isinstance(draft, LeanLM):
            draft.enable_compile(cuda_graphs)
        if cuda_graphs and self.retire_buckets is None:
            self.retire_buckets = capture_sizes(self.max_batch_size)

    def enable_prepack(self, min_rows=None) -> None:
        """Pack the target's and the draft model's linear weights for oneDNN (:meth:`LeanLM.enable_prepack`),
        laid out for ``max_batch_size`` rows of k + 1 tokens (any count runs); ``min_rows``: as there."""
        rows = max(1, min(self.max_batch_size, 64)) * (self.k + 1)
        self.target.enable_prepack(rows, min_rows)
        draft = getattr(self.drafter, "model", None)
        if isinstance(draft, LeanLM):
            draft.enable_prepack(max(1, min(self.max_batch_size, 64)), min_rows)

    @property
    def device(self) -> torch.device:
        return self.target.lm_head.weight.device

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> RolloutOutput:
        """Complete every prompt (list of token ids, each non-empty) once.

        Raises:
            ValueError: an empty prompt, or prompt + max_new_tokens + k beyond the model's
                max_position_embeddings.
        """
        return drain(self.generate_steps(prompts, sampling, generator, group_ids))

    def generate_steps(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> Generator[None, None, RolloutOutput]:
        """:meth:`generate` as a Python generator that yields after the prefill and after every
        batched target forward (with its sampling and bookkeeping) and returns the RolloutOutput.
        A driver can so interleave two generations forward by forward
        (workbench.rollout.paired.generate_interleaved) and time each one's own forwards.

        Raises:
            ValueError: as :meth:`generate`, at the first ``next()``.
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError("rollout: every prompt needs at least one token (the BOS token)")
        sp = sampling
        if sp.keyed:  # drafter-invariant sampling: every row's seed, given or drawn from the call's generator
            sp = replace(sp, seeds=row_seeds(sp.seeds, len(prompts), generator))
        group_ids = group_ids if group_ids is not None else list(range(len(prompts)))
        counters, results = SpecCounters(k=self.k), {}
        if self.continuous:  # one batch; the other prompts wait in the queue and join as rows finish
            chunks = [list(range(len(prompts)))]
        else:
            chunks = [
                list(range(i, min(i + self.max_batch_size, len(prompts))))
                for i in range(0, len(prompts), self.max_batch_size)
            ]
        for idx in chunks:
            part, c = yield from self._generate_batch(prompts, idx, sp, generator, group_ids)
            results.update(part)
            counters.merge(c)
        counters.num_generated_tokens = sum(len(r[0]) for r in results.values())
        return RolloutOutput(*([results[i][j] for i in range(len(prompts))] for j in range(3)), counters)

    # ------------------------------------------------------------------ one batch

    def _generate_batch(self, prompts, idx: list[int], sp: SamplingParams, gen, group_ids):
        """Decode the prompts ``idx`` (indices into ``prompts``): the first ``max_batch_size`` as one
        batch, the rest joining it as rows finish (continuous batching). Returns ({index: (tokens,
        logprobs, finish reason)}, counters)."""
        dev, k = self.device, self.k
        P = max(len(prompts[i]) for i in idx)  # every prompt that may join fits the cache
        t_max = P + sp.max_new_tokens + k + 2  # a verification may write k+1 past the budget
        if self.target.cuda_graphs:
            t_max = round_cache_len(t_max, self.target.cfg.max_position_embeddings)  # few distinct cache shapes
        queue = deque(idx[self.max_batch_size :])
        first = idx[: self.max_batch_size]
        # prefix sharing across admissions
        store = PromptStore(Counter(tuple(prompts[i]) for i in queue)) if queue else None
        counters = SpecCounters(k=k)
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        # capacity: admitted rows fill the slots finished rows left, in the same buffers
        state, cache, hidden, prompt_rows, prompt_index = self._start_rows(
            prompts, first, sp, gen, group_ids, t_max, len(first), store
        )
        finished: list = []  # device slices of retired rows, read back once at the end
        if self.drafter is not None:
            ctx = state.context(sp, gen)
            ctx.prompt_rows, ctx.prompt_index = prompt_rows, prompt_index
            # hidden: {layer: (U, P, H)} per distinct prompt, empty unless it reads the target
            self.drafter.start(ctx, hidden)
        state = self._refill(
            state, state.done.tolist(), cache, finished, queue, prompts, sp, gen, group_ids, t_max, store
        )
        yield  # prefill done

        observe = getattr(self.k_policy, "observe", None)  # a policy that learns from measured step times
        while state.n > 0:
            n, t0 = state.n, time.perf_counter()
            k_t = (self.k_policy.choose(n) if self.k_policy is not None else k) if self.drafter is not None else 0
            last = state.tokens.gather(1, (state.lens - 1)[:, None])  # (n, 1) not yet in the cache
            start = state.lens - 1
            if k_t == 0:  # plain decode step (no drafter, or the policy chose not to speculate)
                # (n, 1, V)
                logits, hidden = self.target(last, start, cache, hidden_layers=layers, max_start=state.max_len - 1)
                p = probs_from_logits(logits, sp)  # (n, 1, V)
                # (n, 1): keyed: the Gumbel-max sample keyed by (row seed, completion position)
                out = keyed_sample(p, state.seeds, state.n_gen[:, None]) if sp.keyed else sample(p[:, 0], gen)[:, None]
                n_acc = num_draft = torch.zeros(n, dtype=torch.long, device=dev)
            else:
                prop = self.drafter.propose(state.context(sp, gen), k_t)
                inp = torch.cat([last, prop.tokens], dim=1)  # (n, k_t+1)
                logits, hidden = self.target(inp, start, cache, hidden_layers=layers, max_start=state.max_len - 1)
                p = probs_from_logits(logits, sp)  # (n, k_t+1, V)
                if sp.keyed:  # accept iff the draft is the keyed sample; emit keyed samples (identity with plain)
                    n_acc, out = keyed_verify(p, prop.tokens, prop.num_draft, state.seeds, state.n_gen)
                else:
                    n_acc, out = rejection_sample(p, prop.tokens, prop.probs, prop.num_draft, gen)
                num_draft = prop.num_draft
            lp = p.gather(-1, out[..., None]).squeeze(-1).log()  # (n, k_t+1) log p of emitted tokens

            # Stop at the token budget and at the first EOS among the emitted tokens; rows already
            # finished (kept for a batch-size bucket) emit nothing.
            live = ~state.done
            emit = torch.minimum(n_acc + 1, sp.max_new_tokens - state.n_gen)
            cols = torch.arange(k_t + 1, device=dev)[None, :]
            is_eos = is_stop(out, sp) & (cols < emit[:, None])
            hit_eos = is_eos.any(1) & live
            emit = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emit) * live
            valid = cols < emit[:, None]  # (n, k_t+1)
            # Written by a scatter over every column (unwritten ones keep their value), not by
            # indexing with valid.nonzero(), whose size the host would have to read.
            pos = state.lens[:, None] + cols  # (n, k_t+1) < T_max
            state.tokens.scatter_(1, pos, torch.where(valid, out, state.tokens.gather(1, pos)))
            state.logps.scatter_(1, pos, torch.where(valid, lp, state.logps.gather(1, pos)))
            state.lens = state.lens + emit  # new tensors: a context handed out before keeps its values
            state.n_gen = state.n_gen + emit
            state.eos = state.eos | hit_eos
            state.done = state.done | hit_eos | (state.n_gen >= sp.max_new_tokens)
            # Accepted drafts that were emitted: a draft accepted past the EOS or the token budget
            # is cut and does not count (it would inflate the acceptance length).
            acc = torch.minimum(n_acc, emit)
            per_pos = (acc[:, None] > cols[:, :k_t]).sum(0)  # (k_t,)
            drafted = num_draft * live
            # The step's one device->host read: finished flags (n), longest live row, drafts, accepts.
            host = torch.cat(
                [
                    state.done.long(),
                    torch.where(state.done, 0, state.lens).max()[None],
                    (drafted > 0).sum()[None],
                    drafted.sum()[None],
                    per_pos,
                ]
            ).tolist()
            done_h, (state.max_len, n_drafts, n_draft_tokens), acc_h = host[:n], host[n : n + 3], host[n + 3 :]
            counters.add_step(n, k_t, n_drafts, n_draft_tokens, acc_h)
            if self.k_policy is not None:
                self.k_policy.update(k_t, n, n_drafts, acc_h)
            if self.drafter is not None:
                self.drafter.accept(state.context(sp, gen), emit, hidden)  # lens after the step, tokens emitted (n,)
            if observe is not None:  # the host read above waited for the device: wall time is the step's
                observe(k_t, n, time.perf_counter() - t0)  # (before an admission's prefill: not the step's)
            state = self._refill(state, done_h, cache, finished, queue, prompts, sp, gen, group_ids, t_max, store)
            yield  # one verification (or decode) step done

        return collect(finished), counters

    def _start_rows(
        self,
        prompts,
        idx: list[int],
        sp: SamplingParams,
        gen,
        group_ids,
        t_max: int,
        capacity: int,
        store: PromptStore | None = None,
    ):
        """Prefill the prompts ``idx`` into a new (len(idx), t_max) cache and sample each row's first
        token; prompts in ``store`` are copied, not recomputed. Returns (BatchState, cache, hidden
        {layer: (U, P, H)}, prompt_rows (U,), prompt_index (B,))."""
        dev, B = self.device, len(idx)
        rows_prompts = [prompts[i] for i in idx]
        P = max(map(len, rows_prompts))
        prompt_lens = to_device([len(p) for p in rows_prompts], dev)
        tokens = torch.zeros(B, t_max, dtype=torch.long)  # (B, T_max) prompt + completion
        tokens[:, :P] = torch.tensor([p + [0] * (P - len(p)) for p in rows_prompts])  # one host->tensor copy
        tokens = tokens.to(dev)
        logps = torch.zeros(B, t_max, device=dev)  # (B, T_max) log p of generated tokens
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        # Prefill: right-padded prompts; each row's next-token logits sit at column len-1. Identical
        # prompts (a GRPO group, an audit) are prefilled once and their cache rows copied (prefix
        # sharing, as vLLM's prefix caching does for a group's common prompt).
        logits, hidden, cache, prompt_rows, prompt_index = prefill_shared(
            self.target, rows_prompts, tokens[:, :P], prompt_lens, t_max, layers, capacity, store
        )
        p = probs_from_logits(logits[:, 0], sp)  # (B, V)
        seeds = to_device([sp.seeds[i] for i in idx] if sp.keyed else [0] * B, dev)  # (B,) int64
        rows = torch.arange(B, device=dev)
        first = keyed_sample(p[:, None], seeds, torch.zeros_like(rows)[:, None])[:, 0] if sp.keyed else sample(p, gen)
        tokens[rows, prompt_lens] = first
        logps[rows, prompt_lens] = p.gather(-1, first[:, None]).squeeze(-1).log()
        n_gen = torch.ones(B, dtype=torch.long, device=dev)
        first_stop = is_stop(first, sp)
        done = first_stop | (n_gen >= sp.max_new_tokens)
        state = BatchState(
            tokens,
            logps,
            prompt_lens + 1,
            prompt_lens,
            n_gen,
            to_device([group_ids[i] for i in idx], dev),
            first_stop,
            done,
            seeds,
            list(idx),
            P + 1,
        )
        return state, cache, hidden, prompt_rows, prompt_index

    def _refill(
        self,
        state: BatchState,
        done: list,
        cache,
        finished: list,
        queue: deque,
        prompts,
        sp,
        gen,
        group_ids,
        t_max: int,
        store: PromptStore | None = None,
    ) -> BatchState:
        """Retire the finished rows (``done``: host flags), then admit waiting prompts into the
        freed slots, prefilled and with their first token sampled (continuous batching); repeated
        while admitted rows finish at once (an EOS or a budget of one token)."""
        while True:
            n_live = len(done) - sum(done)
            incoming = min(len(queue), self.max_batch_size - n_live)
            state = self._retire(state, done, cache, finished, incoming)
            if incoming == 0:
                return state
            new_idx = [queue.popleft() for _ in range(incoming)]
            new, new_cache, hidden, prompt_rows, prompt_index = self._start_rows(
                prompts, new_idx, sp, gen, group_ids, t_max, incoming, store
            )
            if store is not None:
                store.admitted([tuple(prompts[i]) for i in new_idx])
            n_old = state.n
            cache.append(new_cache)
            del new_cache
            state = state.cat(new)
            if self.drafter is not None:
                ctx = state.context(sp, gen)
                ctx.prompt_rows, ctx.prompt_index = prompt_rows + n_old, prompt_index
                self.drafter.admit(ctx, hidden, n_old)
            done = state.done.tolist()
            if not any(done[n_old:]):
                return state

    def _retire(self, state: BatchState, done: list, cache, finished: list, incoming: int = 0) -> BatchState:
        """Drop finished rows (``done``: host flags, one per row) from the batch, the cache and the
        drafter; their tokens are kept as device slices in ``finished`` (no read here). The caches
        move the kept rows to the front of their own buffers (no second whole cache).

        With ``retire_buckets`` the batch shrinks only to those sizes: finished rows stay (emitting
        nothing) until the live rows fit the next smaller size, which is then filled up with
        finished rows, so every step runs at a captured batch size. ``incoming``: rows about to be
        admitted; the batch then keeps only the finished rows that round live + incoming up to a size."""
        n, n_live = len(done), len(done) - sum(done)
        if n_live == n:
            return state
        live = [i for i in range(n) if not done[i]]
        dead = [i for i in range(n) if done[i]]
        if self.retire_buckets is not None and n_live + incoming > 0:
            size = n_live + incoming
            if incoming:
                fill = min(min([b for b in self.retire_buckets if b >= size], default=size) - size, len(dead))
            else:
                smaller = [b for b in self.retire_buckets if b < n]
                if not smaller or n_live > smaller[-1]:
                    return state  # the live rows do not fit a smaller bucket yet
                fill = smaller[-1] - n_live
            live, dead = sorted(live + dead[:fill]), dead[fill:]
            if not dead:
                return state
        live = compact_order(live)
        drop = to_device(dead, state.lens.device)
        finished.append(
            (
                [state.orig[i] for i in dead],
                *(
                    t.index_select(0, drop)
                    for t in (state.tokens, state.logps, state.prompt_lens, state.lens, state.eos)
                ),
            )
        )
        keep = to_device(live, state.lens.device)
        moved = to_device([j for j, i in enumerate(live) if i != j], state.lens.device)  # (m,) rows that change
        cache.select(keep, moved)
        if self.drafter is not None:
            self.drafter.select(keep, moved)
        return state.select(keep, live)


def drain(steps: Generator[None, None, Any]) -> Any:
    """Run a generator such as :meth:`RolloutEngine.generate_steps` to the end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
