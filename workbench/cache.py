"""The user cache: where built things live, how their folders are named, how they appear atomically.

A bottom layer: imports nothing of the project, so every layer (tasks, models, drafters,
instruments) can name cache folders without importing the layers that fill them.

    cache_dir()                      # $WB_CACHE_DIR, else the platform user cache folder
    short_hash({"recipe": ...})      # 10 hex chars of sha256(sorted JSON): the key in a folder name
    with atomic_dir(final) as tmp:   # write into tmp; renamed to final only when complete
        ...

Layout under cache_dir(): models/<preset>-<hash>, tokenizer-<hash>, data/ (task jsonl),
drafters/<kind>-<data>-<hash>, cost_curves/<key>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import platformdirs

APP_NAME = "speculation-workbench"


class CacheError(ValueError):
    """The cache folder cannot be used (a file where the folder should be); the message names it and the fix."""


def cache_dir() -> Path:
    """$WB_CACHE_DIR if set (``~`` expanded), else the user cache folder of "speculation-workbench".

    Raises:
        CacheError: something other than a folder is there.
    """
    env = os.environ.get("WB_CACHE_DIR")
    path = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir(APP_NAME))
    there = next((p for p in (path, *path.parents) if p.exists()), None)  # the nearest thing that exists
    if there is not None and not there.is_dir():
        where = f"WB_CACHE_DIR={env}" if env else f"the cache folder {path}"
        raise CacheError(f"{where} is not a folder ({there} is a file): point WB_CACHE_DIR at a folder")
    return path


def short_hash(obj, n: int = 10) -> str:
    """The first ``n`` hex chars of sha256 of ``obj`` as sorted JSON (equal dicts hash equal).

    Raises TypeError if ``obj`` is not JSON-serialisable.
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:n]


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temp folder beside ``final``; on success rename it to ``final``, on error delete it.

    So a folder in the cache is always complete: an interrupted build (crash, Ctrl-C) leaves
    nothing behind, and readers may treat "the folder exists" as "it is done". If another process
    renamed the same folder into place first, its result is kept (builds of one key are identical)
    and ours is discarded; any other rename error is raised.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.rename(tmp, final)  # atomic on one filesystem
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
