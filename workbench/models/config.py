"""A preset's LlamaConfig: its architecture plus the tokenizer's vocabulary size and special ids."""

from __future__ import annotations

from transformers import LlamaConfig, PreTrainedTokenizerFast

from workbench.models.presets import ModelPreset


def make_config(preset: ModelPreset, tok: PreTrainedTokenizerFast) -> LlamaConfig:
    """LlamaConfig of a preset (float32), with vocab size and bos/eos/pad ids from the tokenizer."""
    return LlamaConfig(
        **preset.config_kwargs(),
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
