"""Models: presets (tiny Llama targets and drafts built on first use), the shared tokenizer, loading.

See `workbench.models.build` for the cache layout and `workbench.models.presets` for the presets.
"""

from workbench.models.build import (
    build_info,
    cache_dir,
    check_same_tokenizer,
    is_built,
    list_presets,
    load_model,
    preset_dir,
    resolve_model,
    shared_tokenizer,
)
from workbench.models.presets import PRESETS, ModelPreset, Recipe, count_params, get_preset
from workbench.models.tokenizer import build_tokenizer, decode_completion, encode_example, encode_prompt, encode_text

__all__ = [
    "PRESETS",
    "ModelPreset",
    "Recipe",
    "build_info",
    "build_tokenizer",
    "cache_dir",
    "check_same_tokenizer",
    "count_params",
    "decode_completion",
    "encode_example",
    "encode_prompt",
    "encode_text",
    "get_preset",
    "is_built",
    "list_presets",
    "load_model",
    "preset_dir",
    "resolve_model",
    "shared_tokenizer",
]
