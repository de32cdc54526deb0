"""drafters.pending.PendingSteps: held plain steps equal the naive per-step bookkeeping."""

import pytest
import torch

from drafters.pending import PendingSteps


@pytest.mark.parametrize("runs", [(12,), (12, 5, 12, 20)])
def test_held_columns_follow_rows_that_leave_and_grow_past_the_first_capacity(runs):
    """Several runs on one object (its buffers are reused while they fit; the last run outgrows them)."""
    g = torch.Generator().manual_seed(0)
    held = PendingSteps(max_steps=1000, max_bytes=1 << 30)
    for n in runs:
        _one_run(held, n, g)


def _one_run(held, n, g):
    naive: list[dict] = []  # per step {name: (n, 1, ...)}, re-selected on every selection
    for step in range(40):  # > 16: the buffers double at least once
        cols = {7: torch.randn(n, 1, 5, generator=g), "tok": torch.randint(0, 99, (n, 1), generator=g)}
        assert not held.add(cols)
        naive.append(cols)
        if step % 7 == 3 and n > 2:  # a row leaves (not always the last one)
            rows = torch.tensor([i for i in range(n) if i != (step % n)])
            held.select(rows)
            naive = [{k: v.index_select(0, rows) for k, v in c.items()} for c in naive]
            n -= 1
    assert len(held) == 40
    got = held.take()
    for key in (7, "tok"):
        torch.testing.assert_close(got[key], torch.cat([c[key] for c in naive], 1), rtol=0, atol=0)
    assert len(held) == 0 and held.take() == {}


def test_add_says_when_the_step_or_byte_limit_is_reached():
    by_steps = PendingSteps(max_steps=3, max_bytes=1 << 30)
    assert [by_steps.add({"x": torch.zeros(4, 1)}) for _ in range(3)] == [False, False, True]
    # (4 rows, 16 columns, 8) float32 = the first buffer
    by_bytes = PendingSteps(max_steps=1000, max_bytes=4 * 16 * 8 * 4)
    assert by_bytes.add({"x": torch.zeros(4, 1, 8)})
