"""Build one preset into a folder: train it by its recipe, save weights + tokenizer + build_info.json.

    build_preset(get_preset("tiny"), folder, tokenizer_src=tok_dir)              # a target
    build_preset(get_preset("tiny-draft"), folder, tokenizer_src=t, teacher_dir=t)  # a draft of target folder t

Callers (:func:`workbench.models.resolve.resolve_model`) decide where and whether to build; this
module only trains (:mod:`workbench.models.pretrain`, :mod:`workbench.models.distill`) and writes.
The folder appears atomically (:func:`workbench.cache.atomic_dir`): an interrupted build leaves none.

build_info.json records what was built and how well: preset, role, hash, params, build_version,
torch version, total_seconds, and the recipe's own results (targets: eval_accuracy on the
stop-check prompts and final_eval_accuracy on fresh held-out prompts, both sampled at temperature
1; drafts: top1_agreement and alpha against the target on held-out text).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from workbench.cache import atomic_dir
from workbench.models import distill, pretrain
from workbench.models.checkpoint import copy_tokenizer_files, load_model, load_tokenizer, quiet_hf
from workbench.models.hashes import BUILD_VERSION, preset_hash, tokenizer_hash
from workbench.models.presets import ModelPreset


def num_params(model: torch.nn.Module) -> int:
    """Parameters, tied weights counted once (``parameters()`` yields a shared tensor once)."""
    return sum(p.numel() for p in model.parameters())


def build_preset(
    preset: ModelPreset, final: Path, tokenizer_src: Path, teacher_dir: Path | None = None, progress: bool = True
) -> Path:
    """Train ``preset`` into ``final`` (atomically) with its tokenizer and build_info.json; returns ``final``.

    tokenizer_src: the folder whose tokenizer files are copied (the shared tokenizer for a target,
    the target's folder for a draft). teacher_dir: the built target of a draft, or the built source
    of a grown target (``recipe.grow_from``); required for both (ValueError if missing).
    """
    if preset.role == "draft" and teacher_dir is None:
        raise ValueError(f"preset {preset.name}: a draft needs its built target ({preset.distill_from}) as teacher_dir")
    if preset.recipe.grow_from and teacher_dir is None:
        raise ValueError(
            f"preset {preset.name}: a grown target needs its built source ({preset.recipe.grow_from}) as teacher_dir"
        )
    t0 = time.time()
    tok = load_tokenizer(tokenizer_src)
    if preset.role == "draft":
        teacher, _ = load_model(teacher_dir)
        model, info = distill.distill_draft(preset, tok, teacher, progress)
    elif preset.recipe.grow_from:
        source, _ = load_model(teacher_dir, dtype="float32")
        model, info = pretrain.train_target(preset, tok, progress, source=source)
    else:
        model, info = pretrain.train_target(preset, tok, progress)
    info = dict(
        preset=preset.name,
        role=preset.role,
        hash=preset_hash(preset),
        description=preset.description,
        params=num_params(model),
        distill_from=preset.distill_from,
        teacher_dir=str(teacher_dir) if teacher_dir else None,
        tokenizer=tokenizer_hash(),
        build_version=BUILD_VERSION,
        torch=torch.__version__,
        total_seconds=round(time.time() - t0, 1),
        **info,
    )
    with atomic_dir(final) as tmp, quiet_hf():
        model.save_pretrained(tmp)
        copy_tokenizer_files(tokenizer_src, tmp)
        (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return final
