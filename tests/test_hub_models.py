"""Hugging Face Hub ids as model.target / drafter.model (``workbench.models.hub``), all offline.

A hub cache is laid out by hand from the shipped micro preset, as huggingface_hub lays it out
(``models--ORG--NAME/snapshots/<commit>/`` + ``refs/<branch or tag>``), and ``huggingface_hub`` is
pointed at it (its constants are read at import, so they are patched as well as the environment).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import constants
from typer.testing import CliRunner

from workbench.models.hub import parse_hub_id, resolve_hub_model
from workbench.models.resolve import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V1 = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "testorg/micro-hub"


def lay_out(cache: Path, repo_id: str, src: Path, commit: str, ref: str | None = "main", skip=()) -> Path:
    """Copy checkpoint folder ``src`` into ``cache`` as huggingface_hub's cache holds a snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in skip:
            shutil.copy2(f, snap / f.name)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """An offline hub cache in tmp holding REPO (main = COMMIT, tag v1 = COMMIT_V1), both the micro preset."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    micro = resolve_model("micro", progress=False)
    main = lay_out(cache, REPO, micro, COMMIT)
    v1 = lay_out(cache, REPO, micro, COMMIT_V1, ref="v1")
    return SimpleNamespace(cache=cache, main=main, v1=v1, micro=micro)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("Qwen/Qwen3-0.6B", ("Qwen/Qwen3-0.6B", None)),
        ("org/name@v1.0", ("org/name", "v1.0")),
        (f"org/name@{COMMIT}", ("org/name", COMMIT)),
        ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
        ("tiny", None),  # a preset name
        ("smollm2-135m-instruct", None),
        ("/abs/model", None),
        ("./rel/model", None),
        ("a/b/c", None),
        ("org/", None),
        ("/name", None),
        ("org/na me", None),
        ("org/name@", None),
        ("-org/name", None),
        ("org/name.", None),
        ("org--x/name", None),
        ("org/na..me", None),
        ("org/name@../x", None),
        ("o/" + "n" * 100, None),  # longer than the Hub allows
    ],
)
def test_parse_hub_id(name, expected):
    assert parse_hub_id(name) == expected


def test_an_existing_local_path_is_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "ckpt").mkdir(parents=True)
    assert parse_hub_id("runs/ckpt") is None
    assert parse_hub_id("runs/other") == ("runs/other", None)


def test_cached_id_resolves_to_its_snapshot(hub):
    assert resolve_model(REPO, what="model.target") == hub.main
    assert resolve_model(f"{REPO}@v1") == hub.v1  # a tag pins another commit
    assert resolve_model(f"{REPO}@{COMMIT_V1}") == hub.v1  # a commit hash: its snapshot, no ref needed
    assert resolve_hub_model(REPO, "main", "drafter.model") == hub.main
    assert (hub.main / "config.json").is_file()


def test_missing_id_offline_names_the_fix(hub):
    with pytest.raises(ValueError) as e:
        resolve_model("testorg/missing", what="model.target")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("model.target: ") and "testorg/missing" in msg
    assert "HF_HUB_OFFLINE" in msg and str(hub.cache) in msg and "hf download testorg/missing" in msg
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):  # a revision not cached
        resolve_model(f"{REPO}@v2", what="drafter.model")


def test_snapshot_without_config_is_refused(hub):
    lay_out(hub.cache, "testorg/no-config", hub.micro, COMMIT, skip={"config.json"})
    with pytest.raises(ValueError, match=r"drafter\.model: .*testorg/no-config.*no config\.json"):
        resolve_model("testorg/no-config", what="drafter.model")


def test_unreachable_hub_falls_back_to_the_cache(hub, monkeypatch):
    """Not offline, but no Hub to reach (a closed port): the cache answers; a missing id is a clear error."""
    from conftest import free_port

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert resolve_model(REPO) == hub.main
    with pytest.raises(ValueError, match=r"model\.target: .*testorg/missing.*hub cache.*HF_HUB_OFFLINE"):
        resolve_model("testorg/missing", what="model.target")


def test_drafter_init_key_follows_the_commit(hub):
    """The init cache key covers the resolved snapshot (id and commit): a new revision trains its own."""
    from workbench.drafter_init import init_folder
    from workbench.integrations.trl import model_folder
    from workbench.specs import load_spec
    from workbench.specs.resolve import drafter_init_config

    spec = load_spec("micro", ["drafter.kind=mtp", f"model.target={REPO}"])
    init = drafter_init_config(spec)
    a, b = init_folder(init, resolve_model(REPO)), init_folder(init, resolve_model(f"{REPO}@v1"))
    assert a is not None and b is not None and a != b
    # TRL's model loaded by Hub id: the adapter resolves its folder the same way (not "<id>/config.json")
    trl_model = SimpleNamespace(config=SimpleNamespace(_name_or_path=REPO))
    assert model_folder(trl_model) == hub.main
    assert init_folder(drafter_init_config(spec), model_folder(trl_model)) == a
    assert model_folder(SimpleNamespace(config=SimpleNamespace(_name_or_path=str(hub.micro)))) == hub.micro


def test_wb_run_with_a_hub_id(hub, store):
    from workbench.cli import app

    res = CliRunner().invoke(app, ["run", "micro", f"model.target={REPO}", "grpo.steps=1", "--quiet"])
    assert res.exit_code == 0, res.output
    run = store.search_runs([store.get_experiment_by_name("workbench-micro").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.params["model.target"] == REPO


def test_wb_run_with_a_missing_hub_id_is_one_clear_line(hub, store):
    from workbench.cli import app

    res = CliRunner().invoke(app, ["run", "micro", "model.target=testorg/missing", "grpo.steps=1", "--quiet"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: model.target: ") and "testorg/missing" in lines[0]
    assert "HF_HUB_OFFLINE" in lines[0] and str(hub.cache) in lines[0]


def test_an_eagle3_head_by_hub_id(hub, tmp_path):
    """drafter.model=ORG/NAME for eagle3: the head's snapshot is what the layout checks read."""
    import json

    import torch
    from safetensors.torch import save_file

    from drafters.eagle3_vllm import is_eagle3_folder

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": torch.zeros(2, 6)}, str(head / "model.safetensors"))
    lay_out(hub.cache, "testorg/eagle3-head", head, COMMIT)
    assert is_eagle3_folder("testorg/eagle3-head")
    assert not is_eagle3_folder(REPO)  # a plain Llama checkpoint
    with pytest.raises(ValueError, match=r"drafter\.model: .*testorg/missing-head.*HF_HUB_OFFLINE"):
        is_eagle3_folder("testorg/missing-head")
