"""Where a benchmark ran, for its header and file names: the device, the CPU model and its
instruction sets, versions, the preloaded allocator; and what its draft model is.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from workbench.timing import host_description
from workbench.vllm.runtime import preloaded


def device_slug(device: torch.device | str) -> str:
    """A file-name-safe name of ``device``: ``cpu``, or the CUDA device's name (e.g. ``nvidia-h100-80gb-hbm3``)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    name = torch.cuda.get_device_name(dev).lower()
    return "-".join("".join(ch if ch.isalnum() else " " for ch in name).split())


def machine_info(device: torch.device | str = "cpu") -> dict:
    """Where the bench ran: ``device`` (``cpu`` or ``cuda: <name>``), CPU, thread count, versions, date."""
    dev = torch.device(device)
    name = f"cuda: {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type
    import transformers

    return {
        "device": name,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "host": host_description(dev),  # the CPU model and its instruction sets (AVX-512, AMX), or the GPU
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ld_preload": preloaded(),  # tcmalloc / Intel OpenMP (vLLM-CPU's setup) change both engines' timings
    }


def draft_label(d) -> str:
    """What the bench's draft model is, for its header: ``drafter.model``, or with
    ``drafter.draft_layers`` the target's own first N layers (``drafter.model`` is then not read)."""
    if d.draft_layers is not None:
        return f"the target's first {d.draft_layers} layers, distilled (drafter.draft_layers)"
    return d.model
