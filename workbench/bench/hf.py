"""transformers' contenders of ``wb bench``: plain ``generate()``, ``generate()`` at its strongest
settings (static KV cache + ``torch.compile``), and assisted generation.

The strongest setting is transformers' documented recipe for fast generation (docs "LLM inference
optimization" and "Cache strategies"; installed transformers 5.x): ``generate(...,
cache_implementation="static")`` allocates the KV cache once at its final length, so the decoding
forward has static shapes, and ``generate()`` then compiles that forward with a
``CompileConfig`` (``torch.compile``, mode ``reduce-overhead``: CUDA graphs on a GPU).
transformers compiles by itself on CUDA only; on the CPU ``CompileConfig._compile_all_devices``
asks it to (slow to compile, so ``wb bench`` leaves it off there unless ``--hf-compile``).

A setting that raises (an old transformers without ``CompileConfig``, a graph break under
``fullgraph=True``, out of memory) must not end the whole benchmark: :func:`first_working` probes
each candidate once and returns the errors of those that failed, which ``wb bench`` records in its
JSON beside the row.
"""

from __future__ import annotations

from typing import Callable

import torch

from workbench.rollout.sampling import SamplingParams

# Static cache + compile, strongest first: fullgraph (one graph, no Python between kernels), then
# transformers' own default (fullgraph=False), which survives graph breaks.
COMPILE_SETTINGS: tuple[dict, ...] = (
    {"mode": "reduce-overhead", "fullgraph": True},
    {"mode": "reduce-overhead", "fullgraph": False},
)


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, L) long on ``device``: the prompts left-padded to the
    longest (L tokens), as transformers' batched ``generate()`` expects."""
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        mask[i, L - len(p) :] = 1
    return ids.to(device), mask.to(device)


def generate_kwargs(sp: SamplingParams, max_new_tokens: int, pad_id: int) -> dict:
    """``generate()`` keyword arguments for exactly ``max_new_tokens`` tokens per row (EOS ignored)
    sampled as ``sp`` (greedy when its temperature is 0)."""
    kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=pad_id)
    if sp.greedy:
        kw["do_sample"] = False
    else:
        kw.update(do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or None)
    return kw


def static_kwargs(compile_setting: dict | None, device: torch.device) -> dict:
    """Extra ``generate()`` arguments of the static-cache contender: the cache, and either a
    ``CompileConfig`` (``compile_setting``: its fields) or ``disable_compile`` (None).

    Raises:
        ImportError: the installed transformers has no ``CompileConfig`` (recorded as the setting's error).
    """
    kw: dict = {"cache_implementation": "static"}
    if compile_setting is None:
        kw["disable_compile"] = True
        return kw
    from transformers import CompileConfig

    cc = CompileConfig(**compile_setting)
    if device.type != "cuda":
        cc._compile_all_devices = True  # transformers compiles by itself on accelerators only
    # one compiled forward meets every batch size and the prefill: past TorchDynamo's default limit
    # of 8 recompilations it would silently run eager (raised as the engine's enable_compile does)
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), 64))
    kw["compile_config"] = cc
    return kw


def setting_name(compile_setting: dict | None) -> str:
    """Human-readable name of a static-cache setting (for tables and JSON)."""
    if compile_setting is None:
        return "static cache"
    return "static cache + torch.compile(" + ", ".join(f"{k}={v}" for k, v in compile_setting.items()) + ")"


def hf_generate(
    model,
    prompts: list[list[int]],
    pad_id: int,
    sp: SamplingParams,
    max_new_tokens: int,
    device: torch.device,
    extra: dict | None = None,
    assistant=None,
    k: int = 0,
) -> Callable[[], torch.Tensor]:
    """A call of ``model.generate`` on the left-padded ``prompts`` (on ``device``), returning its
    (B, L + max_new_tokens) ids. ``extra``: more ``generate()`` arguments (:func:`static_kwargs`);
    ``assistant``: a draft model for assisted generation proposing ``k`` tokens per step
    (constant schedule, no confidence threshold: like our draft_model drafter)."""
    ids, mask = left_pad(prompts, pad_id, device)
    kw = generate_kwargs(sp, max_new_tokens, pad_id) | (extra or {})
    if assistant is not None:
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
    return lambda: model.generate(input_ids=ids, attention_mask=mask, **kw)


def error_text(e: BaseException) -> str:
    """``"TypeName: first line of the message"`` (at most 300 characters), for the JSON."""
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg}"[:300]


def first_working(
    candidates: list[tuple[str, Callable[[], Callable[[], object]]]],
    device: torch.device,
    call: Callable[[Callable[[], object]], object] | None = None,
) -> tuple[str | None, Callable[[], object] | None, dict[str, str], object]:
    """(name, fn, errors, first): the first candidate (name, factory of a call ``fn``) whose call
    runs once without raising (this run also compiles, so compilation stays out of the timings),
    the error text per failed candidate, and what ``call(fn)`` returned for that first run (default:
    ``fn()``'s result; the bench passes its timer to keep the first call's peak memory, where
    compiled contenders allocate their CUDA graphs). (None, None, errors, None) when every one
    fails; the CUDA allocator's cache is emptied after a failure (out of memory leaves blocks behind)."""
    errors: dict[str, str] = {}
    for name, make in candidates:
        try:
            fn = make()
            first = call(fn) if call is not None else fn()
            return name, fn, errors, first
        except Exception as e:  # noqa: BLE001 (any failure of a contender is recorded, not fatal)
            errors[name] = error_text(e)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return None, None, errors, None
