"""`wb export`'s drafter folder: the folder vLLM's ``speculative_config.model`` names, for the kinds that have one.

The drafter is rebuilt exactly as the run built it (:func:`workbench.drafter_init.drafter_as_run`: its
init checkpoint, cached under the spec's hash, trained first only if the cache no longer holds it) and
handed to :func:`workbench.vllm.drafter_folder`, the hand-over the vLLM backend itself uses: a draft
model's checkpoint folder as it is, an EAGLE-3 or DFlash head written in vLLM's layout
(``workbench.vllm.export_eagle3`` / ``export_dflash``) into the export folder. Nothing new is written
here. A drafter adapted online during the run is exported as it started: the run keeps no final weights.
"""

from __future__ import annotations

from pathlib import Path

from drafters import drafter_class


def drafter_folder_of(spec, out: Path, progress: bool = False) -> tuple[str | None, str]:
    """(folder for ``speculative_config.model``, where it came from) for ``spec`` (an ``ExperimentSpec``);
    (None, "") for kinds without a model. A draft model with no init and no ``draft_layers`` is its
    ``drafter.model`` resolved, without loading anything.

    Raises:
        ValueError: the target or drafter cannot be loaded (names the spec field).
    """
    from workbench.vllm import drafter_folder

    d = spec.drafter
    cls = drafter_class(d.kind)
    if cls is None or not cls.vllm_weights:
        return None, ""
    if cls.served_as_given(d):
        return drafter_folder(d, None, None, None, out), f"drafter.model={d.model}"

    from workbench.drafter_init import drafter_as_run, init_folder
    from workbench.grpo.build import resolve_device
    from workbench.models import load_model, resolve_model
    from workbench.models.chat import generation_config_of
    from workbench.rollout_builder import rollout_target
    from workbench.specs.resolve import drafter_init_config, rollout_config

    device = resolve_device(spec.model.device)
    path = resolve_model(spec.model.target, progress=progress, what="model.target")
    hf, tok = load_model(path, device=device, dtype=spec.model.dtype)
    cfg = rollout_config(spec, tok, generation_config_of(path))
    lm = rollout_target(hf, cfg)
    init_cfg = drafter_init_config(spec)
    drafter = drafter_as_run(init_cfg, lm, tok, path, device, progress=progress)
    init = init_folder(init_cfg, path)
    folder = drafter_folder(d, drafter, init, lm.cfg, out, cfg.sampling.stop_ids)
    source = (
        f"init checkpoint {init}" if init is not None else f"built without init (drafter.init.data={d.init_data()})"
    )
    return folder, source
