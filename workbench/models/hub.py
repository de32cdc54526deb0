"""Hugging Face Hub ids as model names: ``ORG/NAME`` or ``ORG/NAME@REVISION``, resolved to a snapshot folder.

    parse_hub_id("Qwen/Qwen3-0.6B")            # ("Qwen/Qwen3-0.6B", None)
    parse_hub_id("Qwen/Qwen3-0.6B@main")       # ("Qwen/Qwen3-0.6B", "main")
    parse_hub_id("tiny")                       # None: a preset name, not a Hub id
    resolve_hub_model("Qwen/Qwen3-0.6B", None, "model.target")
    # -> <hub cache>/models--Qwen--Qwen3-0.6B/snapshots/<commit>

The folder comes from ``huggingface_hub.snapshot_download``: the hub cache first (``HF_HUB_CACHE``,
default ``~/.cache/huggingface/hub``), a download where the network allows, and with ``HF_HUB_OFFLINE=1``
(or no network) the cache only. Only the files a checkpoint is loaded from are fetched (configs,
safetensors weights, tokenizer files); ``*.bin`` weights only when the repository has no safetensors.
The folder's name is the commit it holds, so anything keyed by the resolved folder (a drafter init,
:mod:`workbench.drafter_init`) is keyed by the id and the commit: a new revision builds its own.

Every failure is a one-line ``ValueError`` naming the spec field, the id, the hub cache and the fix.
Source: https://huggingface.co/docs/huggingface_hub/guides/download and
https://huggingface.co/docs/huggingface_hub/guides/manage-cache (the cache layout).
"""

from __future__ import annotations

import re
from pathlib import Path

# the names the Hub allows for an owner and a repository: letters, digits, "-", "_", "." (not first or last),
# neither "--" nor ".." (huggingface_hub.utils.validate_repo_id), at most 96 characters in all
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<rev>[A-Za-z0-9._/-]+))?")
MAX_REPO_ID = 96

# files a checkpoint folder is loaded from (workbench.models.checkpoint: AutoModelForCausalLM and AutoTokenizer)
WEIGHT_PATTERNS = ["*.safetensors"]
BIN_PATTERNS = ["*.bin"]  # only when the repository has no safetensors weights
OTHER_PATTERNS = ["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken", "tokenizer*"]


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` if ``name`` is a Hugging Face Hub model id, else None.

    Args:
        name: a spec value such as ``model.target``: ``ORG/NAME`` or ``ORG/NAME@REVISION`` (a branch,
            a tag or a commit hash; ``refs/pr/1`` too). An existing local path, a preset name (no
            ``/``), an absolute or ``./`` path and a string with characters the Hub does not allow
            in a repository id are not Hub ids.

    Returns:
        The repository id and the revision (None: the default branch), or None. Pure apart from
        checking whether ``name`` exists as a local path; nothing is downloaded.

    Source: the Hub's repository-id rules, ``huggingface_hub.utils.validate_repo_id``
    (https://huggingface.co/docs/huggingface_hub/package_reference/utilities).
    """
    if not isinstance(name, str) or Path(name).expanduser().exists():
        return None
    m = _HUB_ID.fullmatch(name)
    if m is None:
        return None
    repo, rev = m.group("repo"), m.group("rev")
    if len(repo) > MAX_REPO_ID or "--" in repo or ".." in repo:
        return None
    if rev is not None and (".." in rev or rev.startswith("/") or rev.endswith("/") or "//" in rev):
        return None
    return repo, rev


def hub_cache_dir() -> Path:
    """The hub cache folder ``huggingface_hub`` reads and downloads into (``HF_HUB_CACHE``; read when
    ``huggingface_hub`` is imported, from ``HF_HUB_CACHE`` or ``HF_HOME``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether ``huggingface_hub`` is in offline mode (``HF_HUB_OFFLINE=1``, read when it is imported)."""
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _hub_error(e: BaseException, shown: str, repo_id: str, what: str, offline: bool) -> ValueError:
    """The one-line error for a failed ``snapshot_download`` of ``shown`` (``ORG/NAME[@REV]``)."""
    from huggingface_hub.utils import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache_dir()
    fetch = (
        f"run `hf download {shown.replace('@', ' --revision ')}` on a machine with network (older huggingface_hub: "
        f"`huggingface-cli download`) and copy its hub cache here, or give a local checkpoint folder"
    )
    if isinstance(e, GatedRepoError):  # (a RepositoryNotFoundError subclass)
        why = (
            f"Hugging Face Hub model {shown} is gated: accept its terms on the Hub and log in "
            "(`hf auth login` or HF_TOKEN)"
        )
    elif isinstance(e, RepositoryNotFoundError):
        why = (
            f"no Hugging Face Hub model {repo_id} (or it is private: log in with `hf auth login` or HF_TOKEN); "
            f"check the id, or give a local checkpoint folder"
        )
    elif isinstance(e, RevisionNotFoundError):
        why = (
            f"Hugging Face Hub model {repo_id} has no revision {shown.partition('@')[2] or 'main'}; check the revision"
        )
    elif type(e).__name__ == "IncompleteSnapshotError":  # (huggingface_hub >= 1.x; a LocalEntryNotFoundError)
        why = (
            f"the cached snapshot of Hugging Face Hub model {shown} in the hub cache {cache} is incomplete (an "
            f"interrupted download?); set HF_HUB_OFFLINE=0 where there is network to complete it, or {fetch}"
        )
    elif offline or isinstance(e, OfflineModeIsEnabled):
        why = (
            f"Hugging Face Hub model {shown} is not in the hub cache {cache} and HF_HUB_OFFLINE=1 forbids downloading "
            f"it; set HF_HUB_OFFLINE=0 where there is network, or {fetch}"
        )
    elif isinstance(e, LocalEntryNotFoundError):
        why = (
            f"Hugging Face Hub model {shown} could not be downloaded (no network?) and is not in the hub cache "
            f"{cache}; {fetch}; set HF_HUB_OFFLINE=1 to use the cache only"
        )
    else:
        why = (
            f"Hugging Face Hub model {shown} could not be fetched into the hub cache {cache} ({_first_line(e)}); "
            f"{fetch}, or set HF_HUB_OFFLINE=1 to use the cache only"
        )
    return ValueError(f"{what}: {why}")


def resolve_hub_model(repo_id: str, revision: str | None = None, what: str = "model") -> Path:
    """The snapshot folder of Hub model ``repo_id`` at ``revision``: from the hub cache, else downloaded.

    Args:
        repo_id: ``ORG/NAME`` (see :func:`parse_hub_id`).
        revision: a branch, tag or commit hash; None for the default branch (``main``).
        what: the spec field it came from (``model.target``, ``drafter.model``), named in errors.

    Returns:
        ``<hub cache>/models--ORG--NAME/snapshots/<commit>``, a Hugging Face checkpoint folder
        (``config.json`` and weights). Only checkpoint files are fetched: ``*.json``, ``*.safetensors``,
        tokenizer files (``tokenizer*``, ``*.model``, ``*.txt``, ``*.tiktoken``, ``*.jinja``), and
        ``*.bin`` weights only when there are no safetensors ones. With ``HF_HUB_OFFLINE=1`` only the
        cache is read; without network ``huggingface_hub`` falls back to the cache itself.

    Raises:
        ValueError: one line naming ``what``, the id, the hub cache and the fix: the model is not
            cached and cannot be downloaded (offline: names ``HF_HUB_OFFLINE``), no such repository
            or revision, a gated or private one, an incomplete cached snapshot, or a snapshot without
            ``config.json`` or weights.

    Source: ``huggingface_hub.snapshot_download``
    (https://huggingface.co/docs/huggingface_hub/package_reference/file_download#huggingface_hub.snapshot_download).
    """
    from huggingface_hub import snapshot_download

    shown = f"{repo_id}@{revision}" if revision else repo_id
    offline = hub_offline()

    def fetch(patterns: list[str]) -> Path:
        try:
            return Path(
                snapshot_download(repo_id, revision=revision, local_files_only=offline, allow_patterns=patterns)
            )
        except Exception as e:  # huggingface_hub's errors (OSError / ValueError subclasses), a proxy error...
            raise _hub_error(e, shown, repo_id, what, offline) from None

    folder = fetch([*OTHER_PATTERNS, *WEIGHT_PATTERNS])
    if not any(folder.glob("*.safetensors")):  # an older repository: PyTorch pickles only
        folder = fetch([*OTHER_PATTERNS, *WEIGHT_PATTERNS, *BIN_PATTERNS])
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{what}: Hugging Face Hub repository {shown} ({folder}) has no config.json: it is not a transformers "
            f"checkpoint; give a model repository, or a local checkpoint folder"
        )
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ValueError(
            f"{what}: Hugging Face Hub model {shown} ({folder}) has no weights (*.safetensors or *.bin) in the hub "
            f"cache {hub_cache_dir()}; "
            + ("set HF_HUB_OFFLINE=0 where there is network to download them" if offline else "check the repository")
        )
    return folder
