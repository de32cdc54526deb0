"""drafter.distill_temperature: the drafter's loss divides draft and target logits by T, for every
trainable kind, at init and online; T = 1 leaves losses and init cache keys as they were."""

import json

import pytest
import torch

from drafters import DrafterTarget, build_drafter
from drafters.targets import TopKLogits, forward_kl, temper
from drafters.training import collate
from workbench.models.losses import forward_kl as dense_kl
from workbench.specs import DrafterSpec

from test_chain_drafters import _rollout_rows


def _make(kind, lm, counts, **fields):
    spec = DrafterSpec(kind=kind, **fields)
    return build_drafter(kind, spec, DrafterTarget(lm, token_counts=counts), torch.device("cpu"))


def test_temper_divides_dense_and_top_k_logits_and_keeps_the_order():
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 4, 500, generator=g) * 3  # (N, L, V)
    assert temper(full, 1.0) is full
    assert torch.allclose(temper(full, 0.5), full * 2)
    tk = TopKLogits.of(full, k=32)
    hot = temper(tk, 0.7)
    assert torch.allclose(hot.values, tk.values / 0.7) and torch.equal(hot.indices, tk.indices)
    assert hot.vocab_size == tk.vocab_size


@pytest.mark.parametrize("T", [0.5, 0.7, 2.0])
def test_forward_kl_at_a_temperature_is_the_kl_of_the_tempered_distributions(T):
    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(2, 5, 300, generator=g), torch.randn(2, 5, 300, generator=g) * 3
    mask = (torch.rand(2, 5, generator=g) > 0.3).float()
    got = forward_kl(student, teacher, mask, temperature=T)
    assert torch.allclose(got, dense_kl(student / T, teacher / T, mask), rtol=1e-5)
    assert not torch.allclose(got, forward_kl(student, teacher, mask))  # the temperature matters


@pytest.mark.parametrize("kind", ["mtp", "eagle3", "dflash"])
def test_a_drafters_loss_at_T_is_its_loss_at_1_on_logits_divided_by_T(target_lm, kind):
    """The wiring: build_drafter sets the loss's temperature from the spec, and draft_loss tempers the
    draft head's logits and the target's alike (so the top-1 agreement does not move)."""
    T = 0.6
    rows, counts = _rollout_rows(target_lm, n=12, layers=(0, 1, 2))
    batch = collate(rows)
    extra = {"draft_vocab_size": 24} if kind != "mtp" else {}
    torch.manual_seed(0)
    cold = _make(kind, target_lm, counts, **extra)
    torch.manual_seed(0)
    hot = _make(kind, target_lm, counts, distill_temperature=T, **extra)
    assert (cold.distill_temperature, hot.distill_temperature) == (1.0, T)
    hot.net.load_state_dict(cold.net.state_dict())

    name = "logits" if kind == "dflash" else "head"  # the net's draft-logit method
    plain = getattr(cold.net, name)
    setattr(cold.net, name, lambda j, o: plain(j, o) / T)
    scaled = type(batch)(batch.input_ids, batch.loss_mask, temper(batch.target_logits, T), batch.hidden)
    torch.manual_seed(1)  # dflash draws its anchors from the global RNG
    want, want_stats = cold.draft_loss(scaled)
    torch.manual_seed(1)
    got, got_stats = hot.draft_loss(batch)
    assert torch.allclose(got, want, rtol=1e-5)
    assert got_stats["draft/top1_agreement"] == want_stats["draft/top1_agreement"]
    setattr(cold.net, name, plain)
    torch.manual_seed(1)
    assert not torch.allclose(cold.draft_loss(batch)[0], got)  # and T = 1 is another loss


def test_the_init_cache_key_holds_the_temperature_only_when_set(tmp_path):
    from workbench.drafter_init import init_folder
    from workbench.specs.load import load_spec
    from workbench.specs.resolve import drafter_init_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def folder(*over):
        return init_folder(drafter_init_config(load_spec("quickstart", ["drafter.kind=eagle3", *over])), tmp_path)

    base = folder()
    assert folder("drafter.distill_temperature=1.0") == base  # earlier heads keep their cache folders
    assert folder("drafter.distill_temperature=0.7") != base
    assert folder("drafter.distill_temperature=0.7") != folder("drafter.distill_temperature=0.5")


@pytest.mark.parametrize("bad", ["0", "-1", "5"])
def test_a_temperature_out_of_range_names_the_field(bad):
    from workbench.specs.load import load_spec

    with pytest.raises(Exception, match="distill_temperature"):
        load_spec("quickstart", [f"drafter.distill_temperature={bad}"])
