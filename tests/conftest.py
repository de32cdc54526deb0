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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_server_with_sweep(tmp_path_factory, name: str, sweep_args: list[str]):
    """Generator for module fixtures: a real `mlflow server` on loopback (sqlite in a tmp dir) with
    a micro sweep logged to it over HTTP; yields (base URL, port, tmp dir); always stops the server."""
    import subprocess

    from typer.testing import CliRunner

    from workbench.cli import app
    from workbench.ui import server_command, wait_ready

    tmp = tmp_path_factory.mktemp(name)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(server_command(f"sqlite:///{tmp}/mlflow.db", "127.0.0.1", port), cwd=tmp, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        if not wait_ready(base, timeout=60, proc=proc):
            pytest.skip(f"mlflow server did not start within 60 s: {(tmp / 'server.log').read_text()[-800:]}")
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp)
            mp.setenv("MLFLOW_TRACKING_URI", base)
            mp.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))  # as _isolated_cache
            res = CliRunner().invoke(app, sweep_args)
            assert res.exit_code == 0, res.output
            yield base, port, tmp
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
