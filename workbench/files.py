"""Files the workbench reads back: what is wrong with one, in words, and the one way every loader turns a
damaged file into a clear answer.

    problem(path)                    # None, or (file, what is wrong with it)
    seal(path)                       # sizes and sha256 of what was just written, recorded beside it
    write_text(path, text)           # temp file + os.replace, sealed (seal=False: a file users may edit)
    check(path, what, fix)           # DamagedFile if problem() finds something
    with reading(path, what, fix):   # a loader's read errors -> DamagedFile: one line, the file, what, the fix
        load(path)

What :func:`problem` checks, without loading anything: a ``.safetensors`` file's length against its
header (a truncated one is shorter than its tensors), ``.json`` and ``.jsonl`` files parse (a jsonl
ends with a newline), and a sealed file or folder against its seal (sizes always, sha256 for files
up to ``HASH_LIMIT``). A cached artifact is checked at each cache hit and rebuilt once when damaged
(:func:`workbench.cache.cached`); a user's own file gets :class:`DamagedFile`, a ValueError whose
message is one line (``wb`` exits 2 with it).

A bottom layer: imports nothing of the project.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SEAL = ".wb-seal.json"  # inside a sealed folder; a sealed file's is ``.<name>.wb-seal.json`` beside it
HASH_LIMIT = 64 << 20  # files up to this size are hashed at every check; larger ones only sized
MAX_HEADER = 100 << 20  # a safetensors header longer than this is not one
LOADER_MODULES = ("safetensors", "tokenizers", "datasets", "pyarrow")  # their errors are read errors


class DamagedFile(ValueError):
    """A file that cannot be read: ``path``, ``reason`` (what is wrong) and the message, one line with the fix."""

    def __init__(self, path: Path, reason: str, what: str, fix: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{what}: cannot read {path}: {reason}; {fix}")


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()[0][:limit] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def is_read_error(e: BaseException) -> bool:
    """Whether ``e`` is what loading a damaged file raises: OSError, ValueError (JSON, UTF-8), EOFError, or an
    error of the loaders' libraries (safetensors' SafetensorError derives from Exception only; tokenizers'
    Rust errors are plain Exceptions)."""
    if isinstance(e, (OSError, ValueError, EOFError)) or type(e) is Exception:
        return True
    return type(e).__module__.split(".")[0] in LOADER_MODULES


def seal_path(path: Path) -> Path:
    path = Path(path)
    return path / SEAL if path.is_dir() else path.with_name(f".{path.name}{SEAL}")


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _members(path: Path) -> dict[str, Path]:
    """A folder's files by name (its seal aside; a checkpoint folder is flat), or a file by its own name."""
    if not path.is_dir():
        return {path.name: path}
    return {f.name: f for f in sorted(path.iterdir()) if f.is_file() and f.name != SEAL}


def seal(path: Path) -> None:
    """Record the size and sha256 of a folder's files (in its ``.wb-seal.json``) or of a file (beside it)."""
    path = Path(path)
    files = {name: {"size": f.stat().st_size, "sha256": _sha256(f)} for name, f in _members(path).items()}
    target = seal_path(path)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"v": 1, "files": files}, indent=1, sort_keys=True))
    os.replace(tmp, target)


def write_text(path: Path, text: str, sealed: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (a temp file beside it, then os.replace: a reader sees the old
    file or the new one, never half of one) and, when ``sealed``, seal it (the old seal goes first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        seal_path(path).unlink(missing_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if sealed:
        seal(path)


def _seal_problem(path: Path) -> tuple[Path, str] | None:
    s = seal_path(path)
    if not s.is_file():
        return None
    try:
        files = json.loads(s.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return s, "its seal (sizes and sha256 recorded when it was written) is unreadable"
    for name, want in files.items():
        f = path / name if path.is_dir() else path
        if not f.is_file():
            return f, "missing (it was written with the rest)"
        size = f.stat().st_size
        if size != want["size"]:
            how = "truncated" if size < want["size"] else "grown"
            return f, f"{size} bytes where {want['size']} were written ({how})"
        if size <= HASH_LIMIT and _sha256(f) != want["sha256"]:
            return f, "its content changed since it was written (sha256 differs from its seal)"
    return None


def _safetensors_problem(f: Path) -> str | None:
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated: {size} bytes, shorter than a safetensors header"
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            return "not a safetensors file (its first 8 bytes are no header length)"
        if 8 + n > size:
            return f"truncated: {size} bytes where its header alone takes {8 + n}"
        try:
            meta = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "its safetensors header is not valid JSON"
    if 8 + n + end > size:
        return f"truncated: {size} bytes where its tensors end at byte {8 + n + end}"
    if 8 + n + end < size:
        return f"{size - 8 - n - end} bytes past its last tensor"
    return None


def _text_problem(f: Path) -> str | None:
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    try:
        if f.suffix == ".json":
            json.loads(text)
            return None
        if text and not text.endswith("\n"):
            return "it ends in the middle of a line (truncated)"
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                json.loads(line)
    except ValueError as e:
        return f"not valid JSON{'' if f.suffix == '.json' else f' lines (line {i})'}: {e}"
    return None


FORMAT_CHECKS = {".safetensors": _safetensors_problem, ".json": _text_problem, ".jsonl": _text_problem}


def problem(path: Path) -> tuple[Path, str] | None:
    """What is wrong with a file or a folder's files, without loading them: (the file, why), or None.

    Missing, a seal that does not match (:func:`seal`), a truncated or malformed safetensors file, JSON
    or JSON lines that do not parse. Files of other formats are checked against a seal only."""
    path = Path(path)
    if not path.exists():
        return path, "it does not exist"
    try:
        found = _seal_problem(path)
        if found:
            return found
        for f in _members(path).values():
            check = FORMAT_CHECKS.get(f.suffix)
            why = check(f) if check else None
            if why:
                return f, why
    except OSError as e:
        return path, first_line(e)
    return None


def check(path: Path, what: str, fix: str) -> None:
    """Raise :class:`DamagedFile` if :func:`problem` finds something wrong with ``path``."""
    found = problem(path)
    if found:
        raise DamagedFile(found[0], found[1], what, fix)


@contextmanager
def reading(path: Path, what: str, fix: str) -> Iterator[None]:
    """Turn the read errors (:func:`is_read_error`) raised in the block into one :class:`DamagedFile`
    naming the damaged file (:func:`problem` finds which, and why), ``what`` (the spec field or the kind
    of file) and ``fix``. Other errors pass through."""
    try:
        yield
    except DamagedFile:
        raise
    except Exception as e:
        if not is_read_error(e):
            raise
        found = problem(path)
        file, why = found if found else (Path(path), first_line(e))
        raise DamagedFile(file, why, what, fix) from e
