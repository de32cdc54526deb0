"""A vLLM rollout backend from the rollout description: the spec checked against what vLLM can run and
the guard (:mod:`workbench.vllm.verdicts`) in :func:`admit`, before anything is built; then the workbench
drafter handed to vLLM (a draft model's folder, an EAGLE-3 head exported in vLLM's layout).

The engine itself is :class:`workbench.vllm.runtime.VLLMBackend` (the ground floor, beside the
rollout layer); this module is what the workbench adds around it and therefore sits above it. Every
instrument builds its vLLM backend through :func:`workbench.rollout_builder.build_backend`, which calls
:func:`vllm_backend` here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from drafters import drafter_class
from workbench.rollout.config import RolloutConfig
from workbench.vllm.runtime import FIX_TAG, VLLMBackend, build_id, check_in_process
from workbench.vllm.speculative import AdmissionConfig, check_vllm_run, speculative_config
from workbench.vllm.verdicts import check_speculation_allowed


def drafter_folder(
    d, drafter, init_path: Path | None, target_cfg, work: Path, stop_ids: tuple[int, ...] = ()
) -> str | None:
    """The folder vLLM loads the drafter (section ``d``, a ``DrafterSpec``) from, as its class gives it
    (:meth:`workbench.rollout.drafter.Drafter.vllm_folder`): a draft model's checkpoint (its init when
    trained, else ``drafter.model``); an EAGLE-3 or DFlash head exported in vLLM's layout into ``work``
    (``stop_ids``: ids DFlash's mask token must not be); None otherwise."""
    cls = drafter_class(d.kind)
    return None if cls is None else cls.vllm_folder(d, drafter, init_path, target_cfg, work, stop_ids)


def admit(run: AdmissionConfig) -> dict[str, str]:
    """Check a run (:func:`workbench.specs.resolve.admission_config` of its spec) against what the vLLM
    backend runs and the guard; returns the run's tags (the build and its verdict). Call it before
    anything is built: it imports vLLM.

    Raises:
        ValueError: a spec vLLM cannot run, or sampled speculation that no passed audit covers
            (names the field, the audit command and the override); ImportError: vLLM is not
            installed (names the extra to install).
    """
    check_vllm_run(run)
    build = build_id(run.rollout.vllm.cpu_expand_fix)
    if "+" + FIX_TAG in build["platform"]:  # the fix only holds with the engine core in this process
        check_in_process()
    return {
        "workbench.vllm.build": f"vllm=={build['vllm']} platform={build['platform']}",
        **check_speculation_allowed(run, build),
    }


def vllm_backend(
    cfg: RolloutConfig,
    target_path,
    device_type: str,
    tags: dict[str, str],
    drafter=None,
    init_path: Path | None = None,
    target_cfg=None,
    drafter_target=None,
) -> VLLMBackend:
    """The speculative (or plain, for drafter.kind none) vLLM backend that ``cfg`` describes.

    Args:
        tags: the run's tags from :func:`admit` (called first, on the spec ``cfg`` was resolved from).
        drafter: the workbench drafter built for this run (draft_model, eagle3, dflash), or None.
        init_path: its init checkpoint folder, if any. target_cfg: the target's ``LMConfig`` (an
            EAGLE-3 or DFlash head's export needs its shape). drafter_target: see ``VLLMBackend``.
    """
    work = tempfile.TemporaryDirectory(prefix="wb-vllm-")
    try:
        d = cfg.drafter
        folder = drafter_folder(d, drafter, init_path, target_cfg, Path(work.name), cfg.sampling.stop_ids)
        sc = speculative_config(d, folder, cfg.vllm.draft_sample_method)
        cls = drafter_class(d.kind)
        reload = (lambda x: x.vllm_state()) if cls is not None and cls.vllm_weights else None
        return VLLMBackend(
            target_path,
            cfg.vllm,
            device_type,
            sc,
            seed=cfg.seed,
            drafter_weights=reload,
            drafter_target=drafter_target,
            tags=tags,
            scratch=work,
        )
    except BaseException:
        work.cleanup()
        raise
