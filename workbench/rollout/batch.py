"""The rollout engine's batch: its per-row tensors, who finished, and the completions read back.

Kept apart from the engine's loop (:mod:`workbench.rollout.engine`) so the loop reads as the
algorithm: ``BatchState`` is what one step reads and replaces; ``collect`` turns the retired rows'
device slices into the caller's lists with one device->host read per field.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.rollout.drafter import DraftContext
from workbench.rollout.sampling import SamplingParams


def to_device(values: list[int], dev: torch.device) -> torch.Tensor:
    """(len,) long on ``dev``; staged in pinned memory and copied asynchronously on CUDA, so the
    host does not wait for the device's queue."""
    if dev.type == "cuda":
        return torch.tensor(values, dtype=torch.long, pin_memory=True).to(dev, non_blocking=True)
    return torch.tensor(values, dtype=torch.long, device=dev)


@dataclass
class BatchState:
    tokens: torch.Tensor  # (B, T_max)
    logps: torch.Tensor  # (B, T_max)
    lens: torch.Tensor  # (B,)
    prompt_lens: torch.Tensor  # (B,)
    n_gen: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,)
    eos: torch.Tensor  # (B,) bool, finished at an EOS
    done: torch.Tensor  # (B,) bool, finished (still in the batch only under retire_buckets)
    seeds: torch.Tensor  # (B,) int64 row seeds of keyed sampling (workbench.rollout.keyed); zeros otherwise
    orig: list[int]  # host: index of each row in the caller's prompt list
    max_len: int  # host: max(lens) of the live rows, from the step's one read

    @property
    def n(self) -> int:
        return len(self.orig)

    def _fields(self) -> tuple[torch.Tensor, ...]:
        return (
            *(self.tokens, self.logps, self.lens, self.prompt_lens, self.n_gen, self.group_ids, self.eos, self.done),
            self.seeds,
        )

    def context(self, sp: SamplingParams, gen: torch.Generator | None) -> DraftContext:
        """The drafter's view of the batch now (the engine replaces, never mutates, ``lens``)."""
        return DraftContext(
            self.tokens, self.lens, self.prompt_lens, self.group_ids, sp, gen, max_len=self.max_len, seeds=self.seeds,
            n_gen=self.n_gen,
        )  # fmt: skip

    def select(self, rows: torch.Tensor, rows_host: list[int]) -> "BatchState":
        return BatchState(
            *(x.index_select(0, rows) for x in self._fields()), [self.orig[i] for i in rows_host], self.max_len
        )

    def cat(self, other: "BatchState") -> "BatchState":
        """This batch's rows, then ``other``'s (continuous batching: admitted prompts join at the end)."""
        return BatchState(
            *(torch.cat([a, b]) for a, b in zip(self._fields(), other._fields())),
            self.orig + other.orig,
            max(self.max_len, other.max_len),
        )


def collect(finished: list) -> dict[int, tuple[list[int], list[float], str]]:
    """The retired rows' completions {caller's index: (tokens, logprobs, finish reason)}: one
    device->host read per field. ``finished``: (orig indices, tokens, logps, prompt_lens, lens, eos)
    device slices, one per retirement."""
    if not finished:
        return {}
    orig = [o for part in finished for o in part[0]]
    toks, lps, p0s, ls, eos = (torch.cat([part[j] for part in finished]).tolist() for j in range(1, 6))
    return {
        orig[i]: (toks[i][p0s[i] : ls[i]], lps[i][p0s[i] : ls[i]], "stop" if eos[i] else "length")
        for i in range(len(orig))
    }


def compact_order(live: list[int]) -> list[int]:
    """The kept rows' order after a retirement: ``out[j]`` = the old row that becomes row j.

    Live rows already below ``len(live)`` stay where they are; the holes there are filled by the
    live rows above, in order (swap-remove). So a retirement moves only as many rows as left,
    which is what a cache's ``select`` then copies (the rows' order carries no meaning: every
    per-row state is selected with the same indices, and results are keyed by ``orig``).
    """
    m = len(live)
    stay = {i for i in live if i < m}
    tail = iter(i for i in live if i >= m)
    return [i if i in stay else next(tail) for i in range(m)]
