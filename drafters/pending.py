"""Plain steps' drafter inputs, held until the drafter is next asked for drafts.

Under adaptive speculation (``drafter.adaptive``) most steps of a compute-bound batch are plain
(k_t = 0). A drafter that reads the target's hidden states (``mtp``, ``eagle3``) still needs each
emitted position's entry in its cache, but only when it next proposes, so it holds them here and
writes them in one forward then (or never, if the batch ends first).

Rows leave the batch often in the long tail. The held columns therefore stay in the row space of
the first held step and a selection only re-indexes the surviving rows: holding a step costs one
write per tensor, a selection one small index operation, whatever the number of steps held. The
buffers are kept from one batch to the next: allocating them afresh (megabytes, fresh pages from
the OS) cost more than the writes themselves (4 % of a plain quickstart generation with eagle3).
"""

from __future__ import annotations

import torch


class PendingSteps:
    """Columns of per-row tensors, one column per held step.

    Args:
        max_steps: steps held at most; :meth:`add` says when they are reached.
        max_bytes: memory the held columns may take (their buffers), likewise.
    """

    def __init__(self, max_steps: int, max_bytes: int):
        self.max_steps, self.max_bytes = max_steps, max_bytes
        self.store: dict = {}  # name -> (rows, capacity, *trailing), reused while the shapes fit
        self.clear()

    def clear(self) -> None:
        self.m = 0  # columns held
        self.rows: torch.Tensor | None = None  # (n,) each live row's row in the buffers
        self.buf: dict = {}  # name -> (n0, capacity, *trailing) views of ``store``: the first held step's row space

    def __len__(self) -> int:
        return self.m

    def add(self, cols: dict) -> bool:
        """Hold one step: ``cols`` maps a name to a (n, 1, *trailing) tensor of the live rows.
        Returns True when ``max_steps`` or ``max_bytes`` is reached (the caller then writes them)."""
        first = next(iter(cols.values()))
        if self.m == 0:
            n0 = first.shape[0]
            self.rows = torch.arange(n0, device=first.device)
            if not self._fits(cols, n0):
                cap = min(self.max_steps, 16)
                self.store = {key: t.new_empty((n0, cap, *t.shape[2:])) for key, t in cols.items()}
            self.buf = {key: b[:n0] for key, b in self.store.items()}
        elif self.m == next(iter(self.buf.values())).shape[1]:  # full: double the capacity
            cap = min(2 * self.m, self.max_steps)
            self.store = self.buf = {
                key: torch.cat([b, b.new_empty((b.shape[0], cap - self.m, *b.shape[2:]))], 1)
                for key, b in self.buf.items()
            }
        for key, t in cols.items():
            self.buf[key][self.rows, self.m] = t[:, 0]  # (n, *trailing) into the live rows' column m
        self.m += 1
        held = sum(b.numel() * b.element_size() for b in self.buf.values())
        return self.m >= self.max_steps or held >= self.max_bytes

    def _fits(self, cols: dict, n0: int) -> bool:
        """Whether the kept buffers can hold a new run of ``n0`` rows of ``cols``."""
        return cols.keys() == self.store.keys() and all(
            b.shape[0] >= n0 and b.shape[2:] == t.shape[2:] and b.dtype == t.dtype and b.device == t.device
            for key, t in cols.items()
            for b in (self.store[key],)
        )

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (indices into the live rows), as the engine's batch does."""
        if self.m:
            self.rows = self.rows.index_select(0, rows)

    def take(self) -> dict:
        """The held columns of the live rows, name -> (n, m, *trailing), and forget them."""
        out = {key: b[:, : self.m].index_select(0, self.rows) for key, b in self.buf.items()}
        self.clear()
        return out
