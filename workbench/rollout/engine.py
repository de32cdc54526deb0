"""Batched rollout engine: autoregressive and exact speculative generation over one KV cache.

One code path for CPU and CUDA. A batch of prompts is prefilled once; then every step either
decodes one token per row (no drafter) or verifies k drafts per row in one target forward and
emits each row's own number of tokens (ragged acceptance, DESIGN.md §4). Rows that finish leave
the batch (the cache and the drafter drop them), so no row waits for or is cut back to another.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.rollout.drafter import DraftContext, Drafter
from workbench.rollout.model import LeanLM
from workbench.rollout.rejection import rejection_sample
from workbench.rollout.sampling import SamplingParams, probs_from_logits, sample


@dataclass
class SpecCounters:
    """Acceptance counters in vLLM's vocabulary, summed over a rollout batch."""

    k: int = 0
    num_drafts: int = 0  # verification steps of a row that had >= 1 draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_verify_steps: int = 0  # batched target forwards after prefill
    num_generated_tokens: int = 0
    # rows in each batched target forward after prefill (tokens in flight = rows * (k+1)): what a
    # cost curve turns into a noise-free time estimate (workbench.perf.modeled, speedup/gen_modeled)
    rows_per_forward: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.k

    def merge(self, other: "SpecCounters") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_verify_steps += other.num_verify_steps
        self.num_generated_tokens += other.num_generated_tokens
        self.rows_per_forward += other.rows_per_forward
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n

    def metrics(self) -> dict[str, float]:
        """``spec/*`` metrics: acceptance length = 1 + accepted / drafts (vLLM's mean acceptance length)."""
        if self.k == 0 or self.num_drafts == 0:
            return {"spec/num_drafts": float(self.num_drafts)} if self.k else {}
        out = {
            "spec/acceptance_length": 1.0 + self.num_accepted_tokens / self.num_drafts,
            "spec/acceptance_rate": self.num_accepted_tokens / max(self.num_draft_tokens, 1),
            "spec/num_drafts": float(self.num_drafts),
            "spec/num_draft_tokens": float(self.num_draft_tokens),
            "spec/num_accepted_tokens": float(self.num_accepted_tokens),
        }
        for i, n in enumerate(self.num_accepted_tokens_per_pos):
            out[f"spec/acceptance_rate_pos_{i}"] = n / self.num_drafts
        return out


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
        k: num_speculative_tokens (ignored without a drafter).
        max_batch_size: rows decoded together; more prompts are processed in chunks.
    """

    def __init__(self, target: LeanLM, drafter: Drafter | None = None, k: int = 3, max_batch_size: int = 256):
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.max_batch_size = max_batch_size

    def enable_compile(self) -> None:
        """``torch.compile`` the target's decode/verify forwards, and the draft model's if there is one."""
        self.target.enable_compile()
        draft = getattr(self.drafter, "model", None)
        if isinstance(draft, LeanLM):
            draft.enable_compile()

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
        group_ids = group_ids if group_ids is not None else list(range(len(prompts)))
        out = RolloutOutput([], [], [], SpecCounters(k=self.k))
        for i in range(0, len(prompts), self.max_batch_size):
            part = yield from self._generate_batch(prompts[i : i + self.max_batch_size], sampling, generator, group_ids[i : i + self.max_batch_size])
            out.tokens += part.tokens
            out.logprobs += part.logprobs
            out.finish_reasons += part.finish_reasons
            out.counters.merge(part.counters)
        return out

    # ------------------------------------------------------------------ one batch

    def _generate_batch(self, prompts, sp: SamplingParams, gen, group_ids) -> RolloutOutput:
        dev, k, B = self.device, self.k, len(prompts)
        prompt_lens = torch.tensor([len(p) for p in prompts], device=dev)
        P = int(prompt_lens.max())
        t_max = P + sp.max_new_tokens + k + 2  # a verification may write k+1 past the budget
        tokens = torch.zeros(B, t_max, dtype=torch.long)  # (B, T_max) prompt + completion
        tokens[:, :P] = torch.tensor([p + [0] * (P - len(p)) for p in prompts])  # one host->tensor copy
        tokens = tokens.to(dev)
        logps = torch.zeros(B, t_max, device=dev)  # (B, T_max) log p of generated tokens
        counters = SpecCounters(k=k)
        eos = -1 if sp.eos_token_id is None else sp.eos_token_id

        # Prefill: right-padded prompts; each row's next-token logits sit at column len-1. Identical
        # prompts (a GRPO group, an audit) are prefilled once and their cache rows copied (prefix
        # sharing, as vLLM's prefix caching does for a group's common prompt).
        layers = self.drafter.hidden_layers if self.drafter is not None else ()
        logits, hidden, cache, prompt_rows, prompt_index = self._prefill(prompts, tokens[:, :P], prompt_lens, t_max, layers)
        p = probs_from_logits(logits[:, 0], sp)  # (B, V)
        first = sample(p, gen)
        lens = prompt_lens.clone()
        rows = torch.arange(B, device=dev)
        tokens[rows, lens] = first
        logps[rows, lens] = p.gather(-1, first[:, None]).squeeze(-1).log()
        lens += 1
        n_gen = torch.ones(B, dtype=torch.long, device=dev)
        done = (first == eos) | (n_gen >= sp.max_new_tokens)

        state = _BatchState(tokens, logps, lens, prompt_lens, n_gen, torch.tensor(group_ids, device=dev), torch.arange(B, device=dev))
        results: dict[int, tuple[list[int], list[float], str]] = {}
        if self.drafter is not None:
            ctx = state.context(sp, gen)
            ctx.prompt_rows, ctx.prompt_index = prompt_rows, prompt_index
            self.drafter.start(ctx, hidden)  # hidden: {layer: (U, P, H)} per distinct prompt, empty unless it reads the target
        state = self._retire(state, done, first == eos, cache, results)
        yield  # prefill done

        while state.lens.numel() > 0:
            n = state.lens.shape[0]
            last = state.tokens.gather(1, (state.lens - 1)[:, None])  # (n, 1) not yet in the cache
            start = state.lens - 1
            if self.drafter is None:
                logits, _ = self.target(last, start, cache)  # (n, 1, V)
                p = probs_from_logits(logits, sp)  # (n, 1, V)
                out = sample(p[:, 0], gen)[:, None]  # (n, 1)
                emit = torch.ones(n, dtype=torch.long, device=dev)
                hidden = {}
            else:
                ctx = state.context(sp, gen)
                prop = self.drafter.propose(ctx, k)
                inp = torch.cat([last, prop.tokens], dim=1)  # (n, k+1)
                logits, hidden = self.target(inp, start, cache, hidden_layers=self.drafter.hidden_layers)
                p = probs_from_logits(logits, sp)  # (n, k+1, V)
                n_acc, out = rejection_sample(p, prop.tokens, prop.probs, prop.num_draft, gen)
                emit = n_acc + 1
                counters.num_drafts += int((prop.num_draft > 0).sum())
                counters.num_draft_tokens += int(prop.num_draft.sum())
            counters.num_verify_steps += 1
            counters.rows_per_forward.append(n)
            lp = p.gather(-1, out[..., None]).squeeze(-1).log()  # (n, k+1) log p of emitted tokens

            # Stop at the token budget and at the first EOS among the emitted tokens.
            emit = torch.minimum(emit, sp.max_new_tokens - state.n_gen)
            cols = torch.arange(out.shape[1], device=dev)[None, :]
            is_eos = (out == eos) & (cols < emit[:, None])
            hit_eos = is_eos.any(1)
            emit = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emit)
            valid = cols < emit[:, None]  # (n, k+1)
            if self.drafter is not None:
                # Accepted drafts that were emitted: a draft accepted past the EOS or the token
                # budget is cut and does not count (it would inflate the acceptance length).
                acc = torch.minimum(n_acc, emit)
                counters.num_accepted_tokens += int(acc.sum())
                per_pos = (acc[:, None] > torch.arange(k, device=dev)[None, :]).sum(0).tolist()
                for i, c in enumerate(per_pos):
                    counters.num_accepted_tokens_per_pos[i] += c
            r, c = valid.nonzero(as_tuple=True)
            state.tokens[r, state.lens[r] + c] = out[r, c]
            state.logps[r, state.lens[r] + c] = lp[r, c]
            state.lens = state.lens + emit  # new tensors: a context handed out before keeps its values
            state.n_gen = state.n_gen + emit
            if self.drafter is not None:
                self.drafter.accept(state.context(sp, gen), emit, hidden)  # lens after the step, tokens emitted (B,)
            done = hit_eos | (state.n_gen >= sp.max_new_tokens)
            state = self._retire(state, done, hit_eos, cache, results)
            yield  # one verification (or decode) step done

        counters.num_generated_tokens = sum(len(results[i][0]) for i in results)
        order = range(B)
        return RolloutOutput(
            [results[i][0] for i in order], [results[i][1] for i in order], [results[i][2] for i in order], counters
        )

    def _prefill(self, prompts, tokens: torch.Tensor, prompt_lens: torch.Tensor, t_max: int, layers):
        """Prefill (B, P) right-padded prompts into a new (B, t_max) KV cache.

        Distinct prompts only (prefix sharing): U rows are computed once and their cache rows
        copied to all B rows. Returns next-token logits (B, 1, V), hidden states {layer: (U, P, H)}
        of the distinct prompts, the cache, ``prompt_rows`` (U,) (a row holding each distinct
        prompt) and ``prompt_index`` (B,) (each row's distinct prompt).
        """
        B, dev = tokens.shape[0], tokens.device
        first: dict[tuple[int, ...], int] = {}  # prompt -> its first row
        for b, p in enumerate(prompts):
            first.setdefault(tuple(p), b)
        U = len(first)
        order = {row: u for u, row in enumerate(first.values())}
        uniq = torch.tensor(list(first.values()), device=dev)  # (U,)
        inv = torch.tensor([order[first[tuple(p)]] for p in prompts], device=dev)  # (B,)
        cache = self.target.new_cache(U, t_max)
        zeros = torch.zeros(U, dtype=torch.long, device=dev)
        logits, hidden = self.target(tokens[uniq], zeros, cache, hidden_layers=layers, logits_col=prompt_lens[uniq] - 1)
        if U < B:
            cache.select(inv)  # (U, ...) -> (B, ...)
            logits = logits[inv]
        return logits, hidden, cache, uniq, inv

    def _retire(self, state, done, hit_eos, cache, results):
        """Record finished rows and drop them from the batch, the cache and the drafter."""
        if not bool(done.any()):
            return state
        idx = done.nonzero().flatten()
        # One host transfer per field for all finished rows (not per row: the audit retires 10^5).
        toks, lps = state.tokens[idx].tolist(), state.logps[idx].tolist()
        p0s, ls, origs, eos = (t[idx].tolist() for t in (state.prompt_lens, state.lens, state.orig, hit_eos))
        for i in range(len(origs)):
            results[origs[i]] = (toks[i][p0s[i] : ls[i]], lps[i][p0s[i] : ls[i]], "stop" if eos[i] else "length")
        keep = (~done).nonzero().flatten()
        state = state.select(keep)
        cache.select(keep)
        if self.drafter is not None:
            self.drafter.select(keep)
        return state


def drain(steps: Generator[None, None, Any]) -> Any:
    """Run a generator such as :meth:`RolloutEngine.generate_steps` to the end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


@dataclass
class _BatchState:
    tokens: torch.Tensor  # (B, T_max)
    logps: torch.Tensor  # (B, T_max)
    lens: torch.Tensor  # (B,)
    prompt_lens: torch.Tensor  # (B,)
    n_gen: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,)
    orig: torch.Tensor  # (B,) index of each row in the caller's prompt list

    def context(self, sp: SamplingParams, gen: torch.Generator | None) -> DraftContext:
        """The drafter's view of the batch now (the engine replaces, never mutates, ``lens``)."""
        return DraftContext(self.tokens, self.lens, self.prompt_lens, self.group_ids, sp, gen)

    def select(self, rows: torch.Tensor) -> "_BatchState":
        return _BatchState(*(t.index_select(0, rows) for t in (self.tokens, self.logps, self.lens, self.prompt_lens, self.n_gen, self.group_ids, self.orig)))
