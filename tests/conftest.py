"""Shared fixtures: tiny random Llama models (no build, no download) and an isolated cache."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.rollout.model import LeanLM


def random_llama(vocab=48, hidden=64, layers=2, seed=0, tie=False, lm_head_std=1.0, max_pos=256):
    """A random HF Llama with sharp, diverse next-token distributions (large lm_head weights)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=max_pos,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    hf = LlamaForCausalLM(cfg).eval()
    if not tie:
        torch.nn.init.normal_(hf.lm_head.weight, std=lm_head_std)
    return hf


@pytest.fixture(scope="session")
def target_hf():
    return random_llama(seed=0)


@pytest.fixture(scope="session")
def target_lm(target_hf):
    return LeanLM.from_hf(target_hf)


@pytest.fixture(scope="session")
def draft_lm():
    return LeanLM.from_hf(random_llama(layers=1, seed=1))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))
