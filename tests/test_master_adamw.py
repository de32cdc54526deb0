"""``MasterAdamW`` (drafters/training.py): the finite check of half-precision gradients reads the device once
a step, and a single bad gradient skips the step.
"""

import torch


def test_master_adamw_reads_the_device_once_per_step(monkeypatch):
    """The finite check of half-precision gradients: one device->host read for all parameters
    (it was one per parameter, each a synchronisation on CUDA)."""
    from drafters.training import MasterAdamW

    params = [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16)) for _ in range(5)]
    opt = MasterAdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    reads = []
    monkeypatch.setattr(opt.adamw, "step", lambda: None)  # torch's own AdamW is not what is counted
    for name in ("__bool__", "item", "tolist"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name: reads.append(_n) or _o(self, *a))
    assert opt.step() is True
    assert len(reads) == 1, reads
    params[3].grad[0, 0] = float("nan")  # one bad gradient anywhere still skips the step
    monkeypatch.undo()
    assert opt.step() is False
