"""``eagle3`` drafter (EAGLE-3, Li et al. 2025, arXiv 2503.01840; vLLM/SpecForge layout).

Fused feature = fc(low ‖ mid ‖ high) (3H -> H) of the target's hidden states at
``eagle_aux_hidden_state_layer_ids`` (inputs of those layers; default 2, L//2, L-3, mapped for
shallow models); one decoder layer whose attention reads [RMSNorm(emb(token)) ‖ RMSNorm(feature)]
(2H) with the feature as residual; after the first draft step its own pre-norm output replaces
the fused feature. Its LM head covers a reduced draft vocabulary of ``draft_vocab_size`` ids, the
most frequent in the init data (``d2t``: draft id -> target id; ``t2d``: target id -> draft id or
-1). Proposals scatter q back to the target vocabulary (zero outside the draft vocabulary), so
rejection sampling stays exact. Trained with the training-time test (:func:`drafters.ttt.ttt_loss`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from drafters.chain import ChainDrafter, ChainNet
from drafters.eagle3_vllm import export_eagle3, is_eagle3_folder, read_eagle3, to_vllm_state
from drafters.mtp import _load, _save
from drafters.registry import register
from workbench.cache import fix_for
from workbench.files import reading
from workbench.rollout.drafter import DrafterTarget
from workbench.rollout.layers import RMSNorm
from workbench.rollout.model import LMConfig


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's (2, L//2, L-3) for L >= 6; shallow targets use (1, L//2, L-1) clamped to [0, L-1]."""
    L = num_layers
    if L >= 6:
        return (2, L // 2, L - 3)
    return tuple(max(0, min(L - 1, x)) for x in (1, L // 2, L - 1))  # type: ignore[return-value]


def vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft vocabulary from token counts (V,): the ``draft_vocab_size`` most frequent ids (ties: lower id).

    Returns d2t (Vd,) long ascending target ids, and t2d (V,) long (draft id, or -1 outside).
    Raises ValueError if draft_vocab_size > V.
    """
    V = counts.shape[0]
    if draft_vocab_size > V:
        raise ValueError(
            f"drafter.draft_vocab_size: {draft_vocab_size} exceeds the target vocabulary ({V}); use at most {V}"
        )
    order = sorted(range(V), key=lambda i: (-float(counts[i]), i))
    d2t = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(draft_vocab_size)
    return d2t, t2d


class Eagle3Net(ChainNet):
    def __init__(self, cfg: LMConfig, layer_ids: tuple[int, ...], d2t: torch.Tensor, t2d: torch.Tensor):
        super().__init__(cfg, 2 * cfg.hidden_size, 1)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_ids = tuple(layer_ids)
        self.fc = nn.Linear(len(layer_ids) * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, eps)  # token embedding
        self.hidden_norm = RMSNorm(H, eps)  # feature
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, d2t.shape[0], bias=False)
        self.register_buffer("d2t", d2t.clone())
        self.register_buffer("t2d", t2d.clone())

    def fuse(self, hidden):
        return self.fc(torch.cat([hidden[i] for i in self.layer_ids], -1))  # (B, T, 3H) -> (B, T, H)

    def layer_input(self, m, feat, emb):
        return torch.cat(
            [self.input_layernorm(emb), self.hidden_norm(feat)], -1
        ), feat  # (B, T, 2H), residual (B, T, H)

    def logits(self, m, out):
        return self.lm_head(self.norm(out)).float()  # (B, T, Vd) draft vocabulary


def aux_layer_ids(spec, num_layers: int) -> tuple[int, ...]:
    """The target layers a head over its hidden states reads (eagle3, dflash): the spec's
    ``eagle_aux_hidden_state_layer_ids`` or :func:`default_layer_ids`.

    Raises:
        ValueError: an id beyond the target's ``num_layers`` (names the field and a valid choice).
    """
    ids = tuple(spec.eagle_aux_hidden_state_layer_ids or default_layer_ids(num_layers))
    if max(ids) > num_layers:
        raise ValueError(
            f"drafter.eagle_aux_hidden_state_layer_ids: {list(ids)} exceeds the target's {num_layers} layers "
            f"(valid ids 0..{num_layers}); e.g. {list(default_layer_ids(num_layers))}"
        )
    return ids


def draft_vocab(spec, target: DrafterTarget) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t (Vd,), t2d (V,)) of a head's reduced vocabulary: a checkpoint's size (its ids come with its
    weights), else ``draft_vocab_size`` (default V/4 with token counts, else V) most frequent ids of
    ``target.token_counts`` (:func:`vocab_map`)."""
    V, path, counts = target.lm.cfg.vocab_size, target.init_path, target.token_counts
    if path is not None:
        with reading(path, "drafter.init", fix_for(path)):
            vd = json.loads((Path(path) / "drafter_config.json").read_text()).get("draft_vocab_size", V)
        return vocab_map(torch.zeros(V), vd)
    vd = spec.draft_vocab_size or (max(1, V // 4) if counts is not None else V)
    return vocab_map(counts if counts is not None else torch.zeros(V), vd)


@register
class Eagle3Drafter(ChainDrafter):
    kind = "eagle3"
    arch_fields = ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "ttt_steps", "ttt_decay")
    vllm_weights = True  # exported in vLLM's EAGLE-3 layout (drafters/eagle3_vllm.py)
    vllm_head_folder = True
    head_fc_inputs = 3  # fc: three target layers' hidden states, 3H -> H
    reduced_draft_vocab = True

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """vLLM's eagle3 method on the head folder :meth:`vllm_folder` exported."""
        return cls._vllm_model_method(spec, draft_folder, draft_sample_method)

    @classmethod
    def vllm_folder(cls, spec, drafter, init_path, target_cfg, work, stop_ids=()) -> str:
        """The run's head exported in vLLM's EAGLE-3 layout into ``work / "eagle3"``."""
        return str(export_eagle3(drafter.net, target_cfg, work / "eagle3"))

    def vllm_state(self) -> list[tuple[str, torch.Tensor]]:
        """The head's weights in vLLM's EAGLE-3 layout (``midlayer.*``, ``fc``, ``d2t``)."""
        return list(to_vllm_state({n: t.detach() for n, t in self.net.state_dict().items()}).items())

    @classmethod
    def given_trained(cls, spec) -> bool:
        """``drafter.model`` a head in vLLM's layout (`wb drafter export`, public heads): loaded as it is."""
        return bool(spec.model) and is_eagle3_folder(spec.model)

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget, device=None) -> "Eagle3Drafter":
        """Fresh (random layer, LM head rows copied from the target's) or ``target.init_path``'s checkpoint.

        ``target.token_counts`` (V,) (from the init data) picks the draft vocabulary of a fresh drafter;
        without it the default vocabulary is the whole target vocabulary.

        Raises:
            ValueError: layer ids beyond the target's depth, a bad draft_vocab_size, or a checkpoint
                made for another target.
        """
        lm = target.lm
        cfg, V = lm.cfg, lm.cfg.vocab_size
        if cls.given_trained(spec):  # a head in vLLM's layout (`wb drafter export`, public heads)
            return cls._from_vllm_folder(spec, target, device)
        ids = aux_layer_ids(spec, cfg.num_layers)
        d2t, t2d = draft_vocab(spec, target)
        net = Eagle3Net(cfg, ids, d2t, t2d)
        path = target.init_path
        if path is not None:
            _load(net, Path(path), "eagle3", {"hidden_size": cfg.hidden_size, "vocab_size": V, "layer_ids": list(ids)})
        else:
            with torch.no_grad():
                net.lm_head.weight.copy_(lm.lm_head.weight[d2t].float())
        w = lm.lm_head.weight
        net.to(device=w.device, dtype=w.dtype)
        net.share(lm.model.embed_tokens, lm.lm_head)
        return cls(net, ids, V, spec.ttt_steps, spec.ttt_decay)

    @classmethod
    def _from_vllm_folder(cls, spec, target: DrafterTarget, device) -> "Eagle3Drafter":
        """Load an EAGLE-3 head saved in vLLM's layout (:mod:`drafters.eagle3_vllm`) for ``target``.

        Its layer has its own shape (heads, head_dim, intermediate size, RoPE) from its config.json;
        its hidden size and vocabulary must be the target's, its layer ids within the target's depth.

        Raises:
            ValueError: unreadable files, or a head made for another target (names drafter.model).
        """
        from transformers import LlamaConfig

        lm = target.lm
        raw, state = read_eagle3(spec.model)
        head = LMConfig.from_hf(
            LlamaConfig(
                **{
                    k: v
                    for k, v in raw.items()
                    if k not in ("architectures", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
                }
            ),
            what="drafter.model",
        )
        ids = tuple(raw.get("eagle_aux_hidden_state_layer_ids") or default_layer_ids(lm.cfg.num_layers))
        bad = {
            k: (a, b)
            for k, a, b in (
                ("hidden_size", head.hidden_size, lm.cfg.hidden_size),
                ("vocab_size", head.vocab_size, lm.cfg.vocab_size),
            )
            if a != b
        }
        if bad or max(ids) > lm.cfg.num_layers:
            raise ValueError(
                f"drafter.model: the EAGLE-3 head in {spec.model} was made for another target "
                f"(head vs target: {bad or {'layer ids': (list(ids), lm.cfg.num_layers)}})"
            )
        net = Eagle3Net(head, ids, state["d2t"], state["t2d"])
        net.load_state_dict(state)
        w = lm.lm_head.weight
        net.to(device=w.device, dtype=w.dtype)
        net.share(lm.model.embed_tokens, lm.lm_head)
        return cls(net, ids, lm.cfg.vocab_size, spec.ttt_steps, spec.ttt_decay)

    def save(self, folder) -> None:
        n = self.net
        _save(
            n,
            Path(folder),
            {
                "kind": "eagle3",
                "hidden_size": n.cfg.hidden_size,
                "vocab_size": self.vocab_size,
                "layer_ids": list(n.layer_ids),
                "draft_vocab_size": int(n.d2t.shape[0]),
            },
        )
