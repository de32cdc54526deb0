"""Random checkpoints of real architectures (`wb models init`): each family's distinguishing config
field is set, and the folder loads with transformers and the workbench tokenizer."""

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.models import load_model
from workbench.models.shapes import ARCHS, random_checkpoint, shape_config


def test_each_family_sets_its_distinguishing_field():
    assert shape_config("llama3", 64).rope_parameters["rope_type"] == "llama3"
    assert shape_config("qwen2", 64).model_type == "qwen2"
    q3 = shape_config("qwen3", 64, hidden=64, heads=4)
    assert q3.head_dim * q3.num_attention_heads != q3.hidden_size  # head_dim independent of hidden / heads
    assert shape_config("mistral", 64).sliding_window is not None


def test_bad_shapes_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="allowed values: llama, llama3"):
        shape_config("gpt2", 64)
    with pytest.raises(ValueError, match="--kv-heads"):
        shape_config("llama", 64, heads=4, kv_heads=3)


@pytest.mark.parametrize("arch", ARCHS)
def test_random_checkpoint_loads_with_the_shared_tokenizer(tmp_path, arch):
    path = random_checkpoint(arch, tmp_path / arch, layers=1, hidden=32, heads=2, kv_heads=1)
    model, tok = load_model(path)
    assert model.config.model_type == ("llama" if arch.startswith("llama") else arch)
    assert model.config.vocab_size == len(tok) and model.config.eos_token_id == tok.eos_token_id


def test_cli_models_init(tmp_path):
    r = CliRunner().invoke(app, ["models", "init", "qwen3", "--layers", "1", "--hidden", "32", str(tmp_path / "q")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "q" / "config.json").is_file()
    # not empty: refused, nothing overwritten
    r = CliRunner().invoke(app, ["models", "init", "qwen3", str(tmp_path / "q")])
    assert r.exit_code == 2 and "not empty" in " ".join(r.output.split())


def test_cli_models_init_vocab_size(tmp_path):
    """--vocab-size widens embeddings and config to a real vocabulary (issue #24); below the tokenizer's
    ids it is refused, naming the option."""
    r = CliRunner().invoke(
        app, ["models", "init", "llama", "--layers", "1", "--hidden", "32", "--vocab-size", "1000", str(tmp_path / "w")]
    )
    assert r.exit_code == 0, r.output
    model, tok = load_model(tmp_path / "w")
    assert model.config.vocab_size == 1000 > len(tok)
    assert model.get_input_embeddings().weight.shape[0] == 1000
    r = CliRunner().invoke(
        app, ["models", "init", "llama", "--layers", "1", "--hidden", "32", "--vocab-size", "10", str(tmp_path / "n")]
    )
    assert r.exit_code == 2 and "--vocab-size 10" in " ".join(r.output.split())
    assert not (tmp_path / "n").exists()  # refused before anything was written
