"""What determines a built model's weights, as the hash in its folder name.

A preset's folder is ``<name>-<preset_hash>``: the hash covers its config and recipe, the shared
tokenizer, the task data version, BUILD_VERSION and, for drafts, the teacher's hash (for a grown
target, its source's hash). So a changed
recipe or training code names a new folder, and a stale folder (in the cache or shipped in the
package, see :mod:`workbench.models.layout`) is never used for the new recipe.
"""

from __future__ import annotations

from data import arith_chain, general
from workbench.cache import short_hash
from workbench.models.presets import ModelPreset, get_preset
from workbench.models.tokenizer import TOKENIZER_VERSION
from workbench.tasks import get_task

# Bump when the training code changes in a way that changes weights (not needed for recipe or
# config changes: those are hashed themselves). 3: transformers' lr schedule (warmup from 0).
BUILD_VERSION = 3
# Bump when workbench.models.grow changes the weights it makes (hashed into grown targets only).
GROW_VERSION = 1
TOKENIZER_VOCAB = 512
TOKENIZER_CORPUS = dict(task_n=4000, task_seed=1234, general_n=1000, general_seed=1234)


def tokenizer_hash() -> str:
    """10 hex chars identifying the shared tokenizer (recipe version + vocab + corpus + data versions)."""
    return short_hash(
        dict(
            tokenizer_version=TOKENIZER_VERSION,
            vocab=TOKENIZER_VOCAB,
            corpus=TOKENIZER_CORPUS,
            arith_chain=arith_chain.VERSION,
            general=general.VERSION,
        )
    )


def preset_hash(preset: ModelPreset) -> str:
    """10 hex chars of sha256(config + recipe + tokenizer + data version + BUILD_VERSION [+ teacher or source hash])."""
    key = dict(
        preset=preset.to_dict(),
        tokenizer=tokenizer_hash(),
        data=get_task(preset.recipe.seq_source).version,
        build_version=BUILD_VERSION,
    )
    if preset.distill_from:
        key["teacher"] = preset_hash(get_preset(preset.distill_from))
    if preset.recipe.grow_from:  # a grown target's weights start from its source's
        key["grown_from"] = preset_hash(get_preset(preset.recipe.grow_from))
        key["grow_version"] = GROW_VERSION
    return short_hash(key)
