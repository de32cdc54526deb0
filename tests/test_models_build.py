"""Presets, the shared tokenizer cache, and the micro/micro-draft builds end to end (tmp cache)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from data import arith_chain
from workbench import cache as wb_cache
from workbench.models import build, hashes, layout, pretrain, resolve
from workbench.models.checkpoint import build_info, check_same_tokenizer, load_model
from workbench.models.config import make_config
from workbench.models.presets import PRESETS, count_params, get_preset
from workbench.models.tokenizer import build_tokenizer, encode_prompt


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private WB_CACHE_DIR for the whole module, so the builds happen once and never in the user cache;
    and no shipped folders, so these tests build (the shipped ones: test_models_shipped.py)."""
    root = tmp_path_factory.mktemp("wb_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WB_CACHE_DIR", str(root))
        mp.setattr(layout, "SHIPPED_ROOT", root / "shipped")
        yield root


@pytest.fixture(autouse=True)
def _use_module_cache(cache, monkeypatch):
    """Per test, point WB_CACHE_DIR back at the module cache (conftest isolates each test too)."""
    monkeypatch.setenv("WB_CACHE_DIR", str(cache))


@pytest.fixture(scope="module")
def built(cache):
    """(micro folder, micro-draft folder), built once; building the draft builds micro first."""
    draft = resolve.resolve_model("micro-draft", progress=False)
    return resolve.resolve_model("micro", progress=False), draft


def test_cache_dir_env(cache):
    assert wb_cache.cache_dir() == cache


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("WB_CACHE_DIR", raising=False)
    assert "speculation-workbench" in str(wb_cache.cache_dir())


def test_preset_config_and_param_counts():
    assert {"micro", "micro-draft", "tiny", "tiny-draft", "small", "small-draft"} <= set(PRESETS)
    for p in PRESETS.values():
        c = p.config_kwargs()
        assert c["tie_word_embeddings"] and c["rope_theta"] == 10000.0 and not c["attention_bias"]
        assert c["max_position_embeddings"] == 512 and c["hidden_act"] == "silu"
        assert (p.role == "draft") == (p.distill_from is not None)
        if p.distill_from:
            assert PRESETS[p.distill_from].role == "target"
    assert 0.5e6 < count_params(get_preset("tiny")) < 5e6
    assert count_params(get_preset("tiny-draft")) < count_params(get_preset("tiny")) / 3
    assert 80e6 < count_params(get_preset("small")) < 130e6
    assert count_params(get_preset("small-draft")) < count_params(get_preset("small")) / 4


def test_count_params_matches_model(cache):
    from transformers import LlamaForCausalLM

    tok = resolve.shared_tokenizer()
    for name in ("micro", "tiny-draft"):
        p = get_preset(name)
        model = LlamaForCausalLM(make_config(p, tok))
        assert sum(t.numel() for t in model.parameters()) == count_params(p, len(tok))


def test_hashes_stable_and_draft_depends_on_teacher(cache, monkeypatch):
    h = hashes.preset_hash(get_preset("micro-draft"))
    assert h == hashes.preset_hash(get_preset("micro-draft")) and len(h) == 10
    assert layout.cached_preset_dir("micro").name == f"micro-{hashes.preset_hash(get_preset('micro'))}"
    monkeypatch.setattr(hashes, "BUILD_VERSION", hashes.BUILD_VERSION + 1)
    assert hashes.preset_hash(get_preset("micro-draft")) != h


def test_shared_tokenizer_cached(cache):
    d = resolve.tokenizer_dir()
    assert d == cache / f"tokenizer-{hashes.tokenizer_hash()}" and (d / "tokenizer.json").is_file()
    mtime = (d / "tokenizer.json").stat().st_mtime_ns
    assert resolve.tokenizer_dir() == d and (d / "tokenizer.json").stat().st_mtime_ns == mtime
    assert len(resolve.shared_tokenizer()) == 512


def test_micro_build_end_to_end(built):
    target_dir, draft_dir = built
    assert target_dir.parent == wb_cache.cache_dir() / "models"
    assert not [p for p in target_dir.parent.iterdir() if p.name.startswith(".tmp")]  # no half folders
    info = json.loads((target_dir / "build_info.json").read_text())
    assert info["role"] == "target" and info["steps"] == 30 and info["params"] > 0
    assert 0.0 <= info["eval_accuracy"] <= 1.0 and info["seconds"] > 0
    dinfo = build_info(draft_dir)
    assert dinfo["distill_from"] == "micro" and 0.0 <= dinfo["top1_agreement"] <= 1.0
    assert 0.0 <= dinfo["alpha"] <= 1.0
    assert dinfo["init_tensors_from_target"] > 0  # embeddings + layer 0 copied from micro
    # the draft carries the target's tokenizer files byte for byte
    assert (draft_dir / "tokenizer.json").read_bytes() == (target_dir / "tokenizer.json").read_bytes()
    assert layout.is_built("micro") and layout.is_built("micro-draft")


def test_load_and_generate(built):
    target_dir, draft_dir = built
    model, tok = load_model(target_dir)
    draft, dtok = load_model(draft_dir, dtype="float32")
    assert not model.training and model.dtype == torch.float32
    cfg = model.config
    assert cfg.tie_word_embeddings and cfg.vocab_size == len(tok) and cfg.bos_token_id == tok.bos_token_id
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert draft.config.num_hidden_layers == 1
    ids = torch.tensor([encode_prompt(tok, arith_chain.generate(1, 0)[0]["prompt"])])
    out = model.generate(ids, do_sample=False, max_new_tokens=5, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 5


def test_second_resolve_hits_cache(built, monkeypatch):
    target_dir, draft_dir = built
    mtimes = [(d / "model.safetensors").stat().st_mtime_ns for d in built]

    def no_build(*a, **k):
        raise AssertionError("resolve_model rebuilt a cached preset")

    monkeypatch.setattr(build, "build_preset", no_build)
    assert resolve.resolve_model("micro-draft", progress=False) == draft_dir
    assert resolve.resolve_model("micro", progress=False) == target_dir
    assert [(d / "model.safetensors").stat().st_mtime_ns for d in built] == mtimes


def test_resolve_user_folder_and_errors(built, tmp_path):
    target_dir, _ = built
    assert resolve.resolve_model(str(target_dir)) == target_dir  # a checkpoint folder is used as-is
    with pytest.raises(ValueError, match=r"neither a folder with config\.json nor a preset.*tiny-draft"):
        resolve.resolve_model("no-such-model")
    with pytest.raises(ValueError, match=r"drafter\.model.*no config\.json"):
        resolve.resolve_model(str(tmp_path), what="drafter.model")


def test_check_same_tokenizer(built):
    (target_dir, draft_dir) = built
    _, tok = load_model(target_dir)
    _, dtok = load_model(draft_dir)
    check_same_tokenizer(tok, dtok, "drafter.model")  # passes
    other = build_tokenizer(["completely different text " * 3, "zzz yyy xxx"], vocab_size=300)
    with pytest.raises(ValueError, match=r"drafter\.model.*must use the target's tokenizer"):
        check_same_tokenizer(tok, other, "drafter.model")


def test_interrupted_build_leaves_no_folder(cache, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "train_target", boom)
    monkeypatch.setattr(hashes, "BUILD_VERSION", 999)  # a fresh hash, so nothing is cached or shipped
    with pytest.raises(KeyboardInterrupt):
        resolve.resolve_model("micro", progress=False)
    assert not layout.preset_dir("micro").exists()
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".tmp")]


def test_resolve_prefers_a_current_shipped_folder(built, cache, monkeypatch):
    """shipped at the current hash > cache > build; a shipped folder at another hash is never used; force rebuilds."""
    target_dir, _ = built
    shipped = cache / "shipped"
    current = shipped / target_dir.name
    shutil.copytree(target_dir, current)
    try:
        assert resolve.resolve_model("micro", progress=False) == current and layout.preset_dir("micro") == current
        current.rename(shipped / "micro-0123456789")  # a stale recipe's weights: ignored
        assert resolve.resolve_model("micro", progress=False) == target_dir
    finally:
        shutil.rmtree(shipped)
    calls = []
    monkeypatch.setattr(build, "build_preset", lambda preset, final, *a, **k: calls.append(final) or final)
    assert resolve.resolve_model("micro", progress=False, force=True) == target_dir and calls == [target_dir]


def test_warmup_cosine_shape():
    """The builds' and drafter init's schedule: 0 -> lr over the warmup, cosine down to 0.1 lr at the last step."""
    from workbench.models.schedule import MIN_LR_RATE, warmup_cosine

    lr, warmup, total = 3e-3, 10, 100
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = warmup_cosine(opt, warmup, total)
    lrs = []
    for _ in range(total + 1):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[warmup] == pytest.approx(lr)
    assert all(a < b for a, b in zip(lrs[:warmup], lrs[1 : warmup + 1]))  # rising during warmup
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1 :]))  # then never rising
    assert lrs[warmup + (total - warmup) // 2] == pytest.approx(lr * (MIN_LR_RATE + (1 - MIN_LR_RATE) / 2))
    assert lrs[total] == pytest.approx(MIN_LR_RATE * lr) and min(lrs[warmup:]) == pytest.approx(MIN_LR_RATE * lr)
