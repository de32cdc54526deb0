"""Drafter capabilities are class attributes: a new kind registers itself and init, its cache key and the
vLLM backend's choices follow, with no name switch elsewhere to edit."""

from pathlib import Path

import pytest

from drafters import DRAFTERS, drafter_class, register
from drafters.draft_model import DraftModelDrafter
from drafters.eagle3 import Eagle3Drafter
from drafters.ngram import NgramDrafter
from workbench.drafter_init import init_folder
from workbench.rollout.drafter import Drafter
from workbench.specs import load_spec
from workbench.specs.resolve import drafter_init_config


@pytest.fixture
def toy_kinds():
    """Two kinds registered for one test: one with weights (shaped by ``draft_vocab_size``), one without."""

    class ToyHead(Drafter):
        kind = "toy_head"
        trainable = True
        arch_fields = ("draft_vocab_size",)

    class ToyLookup(Drafter):
        kind = "toy_lookup"

    for cls in (ToyHead, ToyLookup):
        register(cls)
    yield
    for cls in (ToyHead, ToyLookup):
        DRAFTERS.pop(cls.kind)


@pytest.fixture
def target_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    return tmp_path


def test_shipped_kinds_declare_what_they_are():
    assert drafter_class("none") is None
    assert not NgramDrafter.trainable and not NgramDrafter.vllm_weights and NgramDrafter.arch_fields == ()
    assert Eagle3Drafter.trainable and Eagle3Drafter.vllm_weights and "draft_vocab_size" in Eagle3Drafter.arch_fields
    assert drafter_class("mtp").trainable and not drafter_class("mtp").vllm_weights  # vLLM runs the target's MTP
    with pytest.raises(ValueError, match="unknown drafter 'nope'.*ngram"):
        drafter_class("nope")


def test_a_new_trainable_kind_is_initialised_and_keyed_by_its_arch_fields(toy_kinds, target_dir):
    spec = load_spec("micro", ["drafter.kind=toy_head"])
    assert spec.drafter.init_data() == "in_domain"  # auto: trainable kinds train before the first step
    a = init_folder(drafter_init_config(spec), target_dir)
    assert a is not None and a.name.startswith("toy_head-in_domain-")
    folder = lambda *o: init_folder(drafter_init_config(load_spec("micro", list(o))), target_dir)  # noqa: E731
    b = folder("drafter.kind=toy_head", "drafter.draft_vocab_size=64")
    c = folder("drafter.kind=toy_head", "drafter.ttt_steps=2")
    assert b != a  # an arch field changes the checkpoint
    assert c == a  # a field the kind does not declare does not


def test_a_new_kind_without_weights_has_nothing_to_initialise(toy_kinds, target_dir):
    spec = load_spec("micro", ["drafter.kind=toy_lookup"])
    assert spec.drafter.init_data() == "none"
    chat = drafter_init_config(load_spec("micro", ["drafter.kind=toy_lookup", "drafter.init.data=chat"]))
    assert init_folder(chat, target_dir) is None


def test_draft_model_trains_only_a_truncated_copy(target_dir):
    given = load_spec("micro", ["drafter.kind=draft_model"]).drafter
    cut = load_spec("micro", ["drafter.kind=draft_model", "drafter.draft_layers=1"]).drafter
    assert not DraftModelDrafter.initialised_by_default(given) and DraftModelDrafter.initialised_by_default(cut)
    assert "draft_layers" not in DraftModelDrafter.arch_key(given) and DraftModelDrafter.arch_key(cut)["draft_layers"]


def test_only_a_finished_head_given_as_drafter_model_skips_the_init(monkeypatch):
    """Drafter.given_trained: no kind at its defaults; eagle3 when drafter.model is a head in vLLM's layout."""
    import drafters.eagle3 as e
    from drafters import DRAFTERS
    from workbench.specs import DrafterSpec

    assert not any(cls.given_trained(DrafterSpec(kind=k)) for k, cls in DRAFTERS.items())
    monkeypatch.setattr(e, "is_eagle3_folder", lambda p: p == "a-head")
    assert e.Eagle3Drafter.given_trained(DrafterSpec(kind="eagle3", model="a-head"))
    assert not e.Eagle3Drafter.given_trained(DrafterSpec(kind="eagle3", model="a-checkpoint"))
