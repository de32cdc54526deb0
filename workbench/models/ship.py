"""Refresh the preset folders shipped in the package (``workbench/models/weights/``).

    python -m workbench.models.ship                  # the SHIPPED presets: build what is stale, copy, prune
    python -m workbench.models.ship tiny tiny-draft  # only these
    python -m workbench.models.ship --force tiny     # rebuild into the cache even if built, then copy

Run it after changing a shipped preset's recipe or config, the tokenizer, the task data or
BUILD_VERSION (tests/test_models_build.py fails until you do), then commit the weights folder.
A preset already shipped at its current hash is left alone (unless --force). A stale one is
built into the user cache (``$WB_CACHE_DIR``; a fresh one avoids reusing anything: e.g.
``WB_CACHE_DIR=/tmp/wb-ship``), copied next to the package code, and older shipped folders of the
same preset are deleted. Building tiny + tiny-draft takes several minutes on a 2-core CPU.

Why ship: a fresh install's first ``wb run`` would otherwise spend minutes training the tiny
presets, and CI (an empty cache) would build the micro presets in every run.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from workbench.cache import atomic_dir
from workbench.models.checkpoint import build_info
from workbench.models.layout import (
    SHIPPED_ROOT,
    preset_folder_name,
    shipped_preset_dir,
    shipped_tokenizer_dir,
    tokenizer_folder_name,
)
from workbench.models.presets import get_preset
from workbench.models.resolve import resolve_model, tokenizer_dir

SHIPPED = (
    "micro",
    "micro-draft",
    "tiny",
    "tiny-draft",
    "tiny-long",
    "tiny-long-draft",
)  # tests, the quickstart, the long tail; small/* are GPU-sized
COMMAND = "python -m workbench.models.ship"


def ship_preset(name: str, force: bool = False, progress: bool = True) -> Path:
    """Make the package ship preset ``name`` at its current hash; returns the shipped folder.

    Builds it into the cache if needed (``force``: rebuild even if built or shipped), copies it
    into SHIPPED_ROOT atomically, and deletes shipped folders of ``name`` at other hashes.
    Raises ValueError for an unknown preset.
    """
    get_preset(name)
    current = shipped_preset_dir(name)
    if current is None or force:
        src = resolve_model(name, progress=progress, force=force)
        current = SHIPPED_ROOT / preset_folder_name(name)
        if src != current:
            shutil.rmtree(current, ignore_errors=True)
            _copy(src, current)
    _prune(name, keep=current.name)
    return current


def ship_tokenizer() -> Path:
    """Ship the shared tokenizer folder at the current tokenizer hash (built if missing); prune older ones."""
    current = shipped_tokenizer_dir()
    if current is None:
        current = SHIPPED_ROOT / tokenizer_folder_name()
        _copy(tokenizer_dir(), current)
    _prune("tokenizer", keep=current.name)
    return current


def _copy(src: Path, dst: Path) -> None:
    with atomic_dir(dst) as tmp:
        for f in src.iterdir():
            if f.is_file():
                shutil.copyfile(f, tmp / f.name)  # not copy2: the package gets plain 644 files, not the cache's modes


def _prune(name: str, keep: str) -> None:
    """Delete SHIPPED_ROOT/<name>-<10 hex> folders other than ``keep`` (``micro`` never matches ``micro-draft-…``)."""
    pattern = re.compile(rf"{re.escape(name)}-[0-9a-f]{{10}}")
    for d in SHIPPED_ROOT.glob(f"{name}-*"):
        if d.is_dir() and pattern.fullmatch(d.name) and d.name != keep:
            shutil.rmtree(d)


def folder_size(path: Path) -> int:
    """Bytes of the files in ``path`` (not recursive: a built folder is flat)."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"presets to ship (default: {' '.join(SHIPPED)})")
    parser.add_argument("--force", action="store_true", help="rebuild into the cache even if already built or shipped")
    args = parser.parse_args(argv)
    print(f"tokenizer -> {ship_tokenizer()}")
    for name in args.names or SHIPPED:
        folder = ship_preset(name, force=args.force)
        info = build_info(folder) or {}
        acc = {k: info[k] for k in ("final_eval_accuracy", "alpha", "top1_agreement") if info.get(k) is not None}
        print(f"{name} -> {folder}  ({folder_size(folder) / 1e6:.2f} MB) {acc}")


if __name__ == "__main__":
    main()
