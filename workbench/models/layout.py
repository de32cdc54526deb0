"""Where built presets and the shared tokenizer are: shipped in the package, or in the user cache.

Two places hold built folders, with the same names (see :mod:`workbench.models.hashes`):

- shipped: ``workbench/models/weights/<name>-<hash>`` and ``.../tokenizer-<hash>``, package data
  built by ``python -m workbench.models.ship`` (the micro and tiny presets, a few MB), so a fresh
  install runs without building them;
- cache: ``cache_dir()/models/<name>-<hash>`` and ``cache_dir()/tokenizer-<hash>``, built on first use.

A shipped folder is used only when its name carries the preset's *current* hash, so a changed
recipe falls through to the cache (and a build) instead of silently using stale shipped weights.
"""

from __future__ import annotations

from pathlib import Path

from workbench.cache import cache_dir
from workbench.models.hashes import preset_hash, tokenizer_hash
from workbench.models.presets import PRESETS, ModelPreset, get_preset

SHIPPED_ROOT = Path(__file__).resolve().parent / "weights"


def preset_folder_name(name: str) -> str:
    """``<name>-<hash>``. Raises ValueError for an unknown preset."""
    return f"{name}-{preset_hash(get_preset(name))}"


def tokenizer_folder_name() -> str:
    return f"tokenizer-{tokenizer_hash()}"


def cached_preset_dir(name: str) -> Path:
    """Where preset ``name`` is (or will be) built in the user cache: cache_dir()/models/<name>-<hash>."""
    return cache_dir() / "models" / preset_folder_name(name)


def shipped_preset_dir(name: str) -> Path | None:
    """The package's built folder of preset ``name`` at its current hash, or None if not shipped."""
    d = SHIPPED_ROOT / preset_folder_name(name)
    return d if (d / "config.json").is_file() else None


def preset_dir(name: str) -> Path:
    """Where preset ``name`` is: its shipped folder if the package has one, else its cache folder
    (which may not exist yet; see `is_built`)."""
    return shipped_preset_dir(name) or cached_preset_dir(name)


def is_built(name: str) -> bool:
    """True if preset ``name`` is shipped or complete in the cache (folders only appear complete)."""
    return (preset_dir(name) / "config.json").is_file()


def cached_tokenizer_dir() -> Path:
    return cache_dir() / tokenizer_folder_name()


def shipped_tokenizer_dir() -> Path | None:
    """The package's shared tokenizer folder at the current tokenizer hash, or None."""
    d = SHIPPED_ROOT / tokenizer_folder_name()
    return d if (d / "tokenizer.json").is_file() else None


def list_presets() -> list[ModelPreset]:
    """All presets, in definition order; see `is_built(p.name)` and `preset_dir(p.name)`."""
    return list(PRESETS.values())
