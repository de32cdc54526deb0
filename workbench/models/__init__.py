"""Models: presets (tiny Llama targets and drafts, shipped or built on first use), the shared tokenizer, loading.

Modules, bottom up:
  presets     the preset table (architecture + recipe), no torch
  tokenizer   the shared BPE tokenizer's recipe and the prompt/completion encoding convention
  hashes      what determines a built folder (BUILD_VERSION, the hash in folder names)
  layout      where built folders are: shipped in the package (weights/) or in the user cache
  checkpoint  load a checkpoint folder (model + tokenizer), compare tokenizers, read build info
  config, batches, losses, schedule, evaluate   pieces of the training recipes
  pretrain    the target recipe;  distill: the draft recipe
  build       train one preset into a folder (weights + tokenizer + build_info.json)
  resolve     name -> folder: checkpoint as-is, shipped, cached, or built (`resolve_model`)
  ship        refresh the shipped folders (`python -m workbench.models.ship`)
"""

from workbench.cache import cache_dir
from workbench.models.checkpoint import build_info, check_same_tokenizer, load_model, quiet_hf
from workbench.models.layout import is_built, list_presets, preset_dir
from workbench.models.presets import PRESETS, ModelPreset, Recipe, count_params, get_preset
from workbench.models.resolve import resolve_model, shared_tokenizer, tokenizer_dir
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
    "quiet_hf",
    "resolve_model",
    "shared_tokenizer",
    "tokenizer_dir",
]
