"""`wb bench`: rollout generation measured side by side: ours vs transformers, and the performance model.

``core``: :class:`Bench` and its tables; ``hf``: transformers' contenders (plain, static cache +
compile, assisted); ``render``: the JSON, Markdown and the multi-result summary.
"""

from workbench.bench.core import (
    Bench,
    BenchConfig,
    Timing,
    batch_predicted_speedup,
    device_slug,
    expected_tokens,
    fit_alpha,
    machine_info,
    measure,
    predicted_speedup,
)
from workbench.bench.render import save, summary_markdown, to_markdown

__all__ = [
    "Bench", "BenchConfig", "Timing", "batch_predicted_speedup", "device_slug", "expected_tokens", "fit_alpha",
    "machine_info", "measure", "predicted_speedup", "save", "summary_markdown", "to_markdown",
]
