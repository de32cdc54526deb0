"""Resolve a model name to a folder: a checkpoint as-is, a preset shipped, cached or built on first use.

    path = resolve_model("tiny")             # shipped folder, else cache_dir()/models/tiny-<hash> (built if missing)
    resolve_model("tiny", force=True)        # rebuild into the cache even if built or shipped
    resolve_model("/my/hf_llama_folder")     # any folder with config.json is used as-is
    resolve_model("Qwen/Qwen3-0.6B@main")    # a Hugging Face Hub id: its snapshot folder (workbench.models.hub)
    tok = shared_tokenizer()                 # the tokenizer every preset uses

Where folders are and how they are named: :mod:`workbench.models.layout`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from data import arith_chain, general
from workbench.cache import atomic_dir, cached
from workbench.files import problem
from workbench.models import build
from workbench.models.checkpoint import load_tokenizer
from workbench.models.hashes import TOKENIZER_CORPUS, TOKENIZER_VOCAB
from workbench.models.hub import parse_hub_id, resolve_hub_model
from workbench.models.imported import PRETRAINED, imported_dir
from workbench.models.layout import cached_preset_dir, cached_tokenizer_dir, shipped_preset_dir, shipped_tokenizer_dir
from workbench.models.presets import PRESETS, get_preset
from workbench.models.tokenizer import build_tokenizer


def tokenizer_dir() -> Path:
    """The shared tokenizer folder: shipped, else cache_dir()/tokenizer-<hash>, built (about 1 s) if missing."""
    shipped = shipped_tokenizer_dir()
    if shipped is not None and _sound_shipped(shipped, "the shared tokenizer"):
        return shipped

    def build_it() -> None:
        c = TOKENIZER_CORPUS
        texts = [it["prompt"] + it["solution"] for it in arith_chain.generate(c["task_n"], c["task_seed"])]
        texts += [it["prompt"] + it["text"] for it in general.generate(c["general_n"], c["general_seed"])]
        tok = build_tokenizer(texts, vocab_size=TOKENIZER_VOCAB)
        with atomic_dir(final) as tmp:
            tok.save_pretrained(tmp)

    final = cached_tokenizer_dir()
    return cached(final, build_it, "the shared tokenizer")


def shared_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer every preset uses (left padding, pad/bos/eos = ids 0/1/2)."""
    return load_tokenizer(tokenizer_dir())


def resolve_model(name_or_path: str, progress: bool = True, what: str = "model", force: bool = False) -> Path:
    """Folder of a model: a checkpoint folder as-is, or a preset's built folder (built if missing).

    name_or_path: a folder containing config.json (a Hugging Face checkpoint, e.g. your own Llama)
    or a preset name (see `list_presets`), or a pretrained preset (:mod:`workbench.models.imported`:
    a real chat model converted from its installed package on first use), or a Hugging Face Hub id
    ``ORG/NAME[@REVISION]`` (:func:`workbench.models.hub.resolve_hub_model`: its snapshot folder in the
    hub cache, downloaded unless HF_HUB_OFFLINE=1). A preset resolves to its shipped folder if the
    package has one at the preset's current hash, else to its cache folder, built there if missing (a
    draft resolves its target first). force: build the preset into the cache even if it is built
    or shipped (its target is resolved normally). `what` names the spec field in error messages.
    Raises ValueError if it is neither a checkpoint folder, a preset nor a Hub id (listing the preset
    names), or a Hub id that cannot be resolved (one line naming the id, the hub cache and HF_HUB_OFFLINE).
    """
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            return p
        raise ValueError(
            f"{what}: folder {name_or_path} has no config.json; give a Hugging Face checkpoint folder "
            f"(save_pretrained output) or a preset name: {', '.join(PRESETS)}"
        )
    if name_or_path in PRETRAINED:  # a real chat model from an installed package, converted on first use
        try:
            return imported_dir(name_or_path, progress=progress, force=force)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    hub = parse_hub_id(name_or_path) if name_or_path not in PRESETS else None
    if hub is not None:  # ORG/NAME[@REVISION]: the hub cache first, then a download where allowed
        return resolve_hub_model(*hub, what=what)
    if name_or_path not in PRESETS:
        raise ValueError(
            f"{what}: {name_or_path!r} is neither a folder with config.json nor a preset nor a Hugging Face Hub "
            f"id (ORG/NAME or ORG/NAME@REVISION); presets: {', '.join([*PRESETS, *PRETRAINED])}"
        )
    if not force:
        shipped = shipped_preset_dir(name_or_path)
        if shipped is not None and _sound_shipped(shipped, what):
            return shipped
    final = cached_preset_dir(name_or_path)
    if force:
        _build(name_or_path, final, progress)
        return final
    return cached(final, lambda: _build(name_or_path, final, progress), what)  # a damaged one is built again


def _sound_shipped(folder: Path, what: str) -> bool:
    """Whether a shipped preset folder reads whole; a damaged one (the installed package was) is passed
    over for the cache with a warning, and the package is never written."""
    found = problem(folder)
    if found:
        print(
            f"warning: {what}: the shipped {found[0]} is damaged ({found[1]}); using the cache instead "
            "(reinstall the workbench to repair it)",
            file=sys.stderr,
        )
    return found is None


def _build(name: str, final: Path, progress: bool) -> None:
    """Build preset ``name`` into ``final``, replacing a folder already there (``force``).

    The old folder is deleted first, so an interrupted forced build leaves no folder (the next
    resolve builds again) rather than a mix of old and new.
    """
    preset = get_preset(name)
    parent = preset.distill_from or preset.recipe.grow_from  # a draft's teacher, a grown target's source
    teacher = resolve_model(parent, progress=progress) if parent else None
    shutil.rmtree(final, ignore_errors=True)
    build.build_preset(preset, final, teacher or tokenizer_dir(), teacher, progress)
