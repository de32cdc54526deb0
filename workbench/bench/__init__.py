"""`wb bench`: rollout generation measured side by side: ours vs transformers, and against the
performance model's prediction (the model itself: :mod:`workbench.perf`).

``core``: :class:`Bench` and its tables; ``machine``: where it ran; ``hf``: transformers' contenders
(plain, static cache + compile, assisted); ``render``: the JSON, Markdown and the multi-result summary.
"""

from workbench.bench.core import Bench, BenchConfig, Timing, measure
from workbench.bench.machine import device_slug, machine_info
from workbench.bench.render import save, summary_markdown, to_markdown

__all__ = [
    "Bench",
    "BenchConfig",
    "Timing",
    "device_slug",
    "machine_info",
    "measure",
    "save",
    "summary_markdown",
    "to_markdown",
]
