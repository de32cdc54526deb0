"""Hugging Face checkpoint folders: load a model and its tokenizer, compare tokenizers, read build info.

model, tok = load_model(path)       # LlamaForCausalLM (eval mode) + its tokenizer (left padding)
with quiet_hf():                    # no transformers progress bars while loading/saving
    model.save_pretrained(folder)
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers import logging as hf_logging

from workbench.cache import fix_for
from workbench.files import check, reading

TOKENIZER_FILES = ("special_tokens_map.json", "chat_template.jinja")  # besides tokenizer*


@contextmanager
def quiet_hf() -> Iterator[None]:
    """Silence transformers' per-call tqdm bars (loading/writing weights), restoring the setting after."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_tokenizer(path: Path, what: str = "model.target") -> PreTrainedTokenizerFast:
    """The tokenizer of a checkpoint folder, with a pad token (eos if it has none) and left padding.

    Raises:
        DamagedFile: a tokenizer file that cannot be read (one line: ``what``, the file, the fix).
    """
    with reading(path, what, fix_for(path)):
        tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:  # many HF checkpoints have none; batching needs one
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # batched generation continues prompts on the right
    return tok


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy the tokenizer files byte for byte, so a draft's tokenizer is exactly its target's."""
    for f in Path(src).iterdir():
        if f.is_file() and (f.name.startswith("tokenizer") or f.name in TOKENIZER_FILES):
            shutil.copy2(f, Path(dst) / f.name)


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype: unknown dtype {dtype!r}; allowed values: float32, bfloat16, float16")
    return getattr(torch, dtype)


def load_model(
    path: Path, device: str = "cpu", dtype: torch.dtype | str = torch.float32, what: str = "model.target"
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """(model in eval mode on device, tokenizer) from a save_pretrained folder.

    device: "cpu", "cuda", "cuda:N" or "auto". dtype: a torch dtype or its name (ValueError if
    unknown). The tokenizer gets left padding and a pad token (eos if the checkpoint has none).

    Raises:
        DamagedFile: a file of the folder that cannot be read (truncated weights, broken JSON): one line
            naming ``what`` (the spec field), the file, what is wrong and the fix.
    """
    path = Path(path)
    dtype = _dtype(dtype)
    fix = fix_for(path)
    check(path, what, fix)  # first: transformers passes over a damaged generation_config.json in silence
    with quiet_hf(), reading(path, what, fix):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(_device(device)).eval(), load_tokenizer(path, what)


def check_same_tokenizer(tok_a: PreTrainedTokenizerFast, tok_b: PreTrainedTokenizerFast, what: str) -> None:
    """Raise ValueError naming `what` (e.g. "drafter.model") if the vocabularies or special ids differ."""
    diffs = []
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        only_a, only_b = len(va.keys() - vb.keys()), len(vb.keys() - va.keys())
        moved = sum(1 for k in va.keys() & vb.keys() if va[k] != vb[k])
        diffs.append(
            f"vocab differs (sizes {len(va)} vs {len(vb)}, {only_a}/{only_b} tokens only in one, {moved} with other "
            "ids)"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(tok_a, attr), getattr(tok_b, attr)
        if a != b:
            diffs.append(f"{attr} {a} vs {b}")
    if diffs:
        raise ValueError(
            f"{what}: tokenizer does not match the target's: {'; '.join(diffs)}. "
            f"The draft checkpoint must use the target's tokenizer (same vocab and special token ids)."
        )


def build_info(path: Path) -> dict | None:
    """The build_info.json of a built preset folder (see `workbench.models.build`), or None (e.g. a user checkpoint)."""
    f = Path(path) / "build_info.json"
    return json.loads(f.read_text()) if f.is_file() else None
