"""The user cache: where built things live, how their folders are named, how they appear atomically.

A bottom layer: imports nothing of the project but :mod:`workbench.files`, so every layer (tasks, models,
drafters, instruments) can name cache folders without importing the layers that fill them.

    cache_dir()                      # $WB_CACHE_DIR, else the platform user cache folder
    short_hash({"recipe": ...})      # 10 hex chars of sha256(sorted JSON): the key in a folder name
    with atomic_dir(final) as tmp:   # write into tmp; sealed, renamed to final only when complete, checked
        ...
    cached(path, build, what)        # path if sound; missing or damaged: build() (once), checked after
    fix_for(path)                    # what a DamagedFile message tells the user to do about ``path``
    writable_or_temp(folder)         # folder, or a temp folder when the cache is read-only

Layout under cache_dir(): models/<preset>-<hash>, tokenizer-<hash>, data/ (task jsonl),
drafters/<kind>-<data>-<hash>, cost_curves/<key>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import platformdirs

from workbench.files import first_line, problem, seal, seal_path

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
    nothing behind. Before the rename the folder is sealed (:func:`workbench.files.seal`: its files'
    sizes and sha256, which every later :func:`cached` check verifies) and after it checked (CacheError
    if it does not read back: a full disk). If another process renamed the same folder into place first,
    its result is kept (builds of one key are identical) and ours is discarded; any other rename error is
    raised.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        seal(tmp)
        try:
            os.rename(tmp, final)  # atomic on one filesystem
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _check_written(final)


def _check_written(path: Path) -> None:
    found = problem(path)
    if found:
        raise CacheError(
            f"the cache entry {path} does not read back after writing it ({found[0].name}: {found[1]}); "
            f"check the disk has room and is healthy (or point WB_CACHE_DIR elsewhere)"
        )


def is_cached(path: Path, root: Path | None = None) -> bool:
    """Whether ``path`` lies in the workbench cache (or in ``root``): ours to delete and rebuild."""
    try:
        return Path(path).resolve().is_relative_to(Path(root or cache_dir()).resolve())
    except (OSError, CacheError):
        return False


def fix_for(path: Path) -> str:
    """The fix a :class:`workbench.files.DamagedFile` message names: a cache entry is rebuilt once it is
    deleted; a user's own file must be replaced."""
    if is_cached(path):
        return f"delete {path} and run again: it is rebuilt"
    return "replace it with a complete copy (save or download it again)"


def remove(path: Path, root: Path | None = None) -> None:
    """Delete a cache entry (folder or file, and a file's seal). Refuses anything outside the cache (or ``root``)."""
    path = Path(path)
    if not is_cached(path, root):
        raise CacheError(f"refusing to delete {path}: it is not in the workbench cache {root or cache_dir()}")
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        seal_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def cached(path: Path, build: Callable[[], object], what: str, root: Path | None = None) -> Path:
    """``path``, a cache entry (file or folder), made sound: built by ``build()`` (which writes it atomically:
    :func:`atomic_dir`, :func:`workbench.files.write_text`) when missing; when it is there but damaged
    (:func:`workbench.files.problem`: truncated, unparsable, not what its seal recorded) deleted with a
    one-line warning on stderr and built again, once. Checked after building. ``root``: the cache folder
    ``path`` lies in, when not the workbench cache (:func:`remove` deletes nothing outside it).

    Raises:
        CacheError: the entry built does not read back (a full or failing disk).
    """
    path = Path(path)
    if path.exists():
        found = problem(path)
        if found is None:
            return path
        where = found[0] if found[0] == path else f"{found[0].name} in {path}"
        print(f"warning: {what}: the cached {where} is damaged ({found[1]}); rebuilding it", file=sys.stderr)
        remove(path, root)
    try:
        build()
    except PermissionError as e:  # a read-only cache without this entry
        raise CacheError(
            f"{what}: cannot write the cache entry {path} ({first_line(e)}); make the cache writable or point "
            "WB_CACHE_DIR at a writable folder"
        ) from None
    _check_written(path)
    return path


def writable_or_temp(folder: Path) -> Path:
    """``folder`` if this process can write there (or create it), else a folder of the same name in the
    temp folder: a read-only cache that holds everything still serves reads, and what libraries write
    beside them (``datasets``' lock files) goes elsewhere."""
    folder = Path(folder)
    there = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if there is not None and os.access(there, os.W_OK | os.X_OK):
        return folder
    alt = Path(tempfile.gettempdir()) / f"{APP_NAME}-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / folder.name
    alt.mkdir(parents=True, exist_ok=True)
    return alt
