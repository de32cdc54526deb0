"""``mtp`` drafter: DeepSeek-V3-style multi-token-prediction modules on the target's last hidden state.

Module m (DeepSeek-V3 tech report, arXiv 2412.19437, §2.2): x = W_m [RMSNorm(h) ‖ RMSNorm(emb(next
token))] (linear 2H -> H), one transformer block over x, then the module's RMSNorm and the target's
LM head. Embedding and LM head are the target's own modules *by reference*, so the `prepare`
weight sync keeps them current at no cost; only the modules are trained. Draft j uses module
min(j, D-1): the last module recurs for k > D (vLLM's behaviour for k > num_nextn_predict_layers).
All modules write into one chain cache and are trained with the chain's unrolled loss
(:mod:`drafters.chain`), so training sees the recursion inference uses; with ``ttt_steps=1`` the
loss is DeepSeek-V3's next-next-token objective (as KD against the target's distribution).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from drafters.chain import ChainDrafter, ChainNet
from drafters.registry import register
from workbench.cache import fix_for
from workbench.files import reading
from workbench.rollout.drafter import DrafterTarget
from workbench.rollout.layers import RMSNorm
from workbench.rollout.model import LMConfig


class MTPNet(ChainNet):
    def __init__(self, cfg: LMConfig, num_modules: int):
        super().__init__(cfg, cfg.hidden_size, num_modules)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.hnorm = nn.ModuleList(RMSNorm(H, eps) for _ in range(num_modules))
        self.enorm = nn.ModuleList(RMSNorm(H, eps) for _ in range(num_modules))
        self.eh_proj = nn.ModuleList(nn.Linear(2 * H, H, bias=False) for _ in range(num_modules))
        self.input_layernorm = nn.ModuleList(RMSNorm(H, eps) for _ in range(num_modules))
        self.norm = nn.ModuleList(RMSNorm(H, eps) for _ in range(num_modules))  # DeepSeek-V3's shared_head.norm
        self.feature_layer = cfg.num_layers

    def fuse(self, hidden):
        return hidden[self.feature_layer]  # (B, T, H) last layer's output (before the final norm)

    def layer_input(self, m, feat, emb):
        x = self.eh_proj[m](torch.cat([self.hnorm[m](feat), self.enorm[m](emb)], -1))  # (B, T, 2H) -> (B, T, H)
        return self.input_layernorm[m](x), x

    def logits(self, m, out):
        return self._shared["lm_head"](self.norm[m](out)).float()  # (B, T, V) target vocabulary


@register
class MTPDrafter(ChainDrafter):
    kind = "mtp"
    arch_fields = ("num_nextn_predict_layers", "ttt_steps", "ttt_decay")
    head_fc_inputs = 2  # eh_proj: the hidden state and the next token's embedding, 2H -> H

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """Refused: vLLM's MTP method runs a target checkpoint's own MTP layers, not these heads.

        Raises:
            ValueError: always, naming the drafters vLLM can run instead.
        """
        raise ValueError(
            "drafter.kind=mtp with rollout.backend=vllm: vLLM runs MTP only from target checkpoints that carry "
            "native MTP layers (DeepSeek-V3, Qwen3-Next, ...), not the workbench's own MTP heads; use "
            "drafter.kind=eagle3 or draft_model, or rollout.backend=workbench"
        )

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget, device=None) -> "MTPDrafter":
        """Fresh modules (random init) or the checkpoint at ``target.init_path`` (``wb drafter init``).

        Raises:
            ValueError: a checkpoint made for another target shape or module count.
        """
        lm = target.lm
        net = MTPNet(lm.cfg, spec.num_nextn_predict_layers)
        path = target.init_path
        if path is not None:
            _load(
                net,
                Path(path),
                "mtp",
                {
                    "hidden_size": lm.cfg.hidden_size,
                    "vocab_size": lm.cfg.vocab_size,
                    "num_modules": spec.num_nextn_predict_layers,
                },
            )
        w = lm.lm_head.weight
        net.to(device=w.device, dtype=w.dtype)
        net.share(lm.model.embed_tokens, lm.lm_head)
        return cls(net, (lm.cfg.num_layers,), lm.cfg.vocab_size, spec.ttt_steps, spec.ttt_decay)

    def save(self, folder) -> None:
        c = self.net.cfg
        _save(
            self.net,
            Path(folder),
            {
                "kind": "mtp",
                "hidden_size": c.hidden_size,
                "vocab_size": c.vocab_size,
                "num_modules": self.net.num_modules,
            },
        )


def _save(net: nn.Module, folder: Path, config: dict) -> None:
    """Checkpoint folder: ``drafter_config.json`` + ``model.safetensors`` (the drafter's own weights)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "drafter_config.json").write_text(json.dumps(config, indent=2))
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors")
    )


def _load(net: nn.Module, folder: Path, kind: str, expect: dict) -> dict:
    """Load a ``_save`` folder into ``net``; returns its config.

    Raises:
        DamagedFile: missing or damaged files (one line naming the file and the fix).
        ValueError: another kind, or config values differing from ``expect``.
    """
    from safetensors.torch import load_file

    with reading(folder, "drafter.init", fix_for(folder)):
        config = json.loads((folder / "drafter_config.json").read_text())
        state = load_file(str(folder / "model.safetensors"))
    bad = {k: (config.get(k), v) for k, v in expect.items() if config.get(k) != v}
    if config.get("kind") != kind or bad:
        raise ValueError(
            f"drafter.init: checkpoint {folder} is a {config.get('kind')} drafter for another target "
            f"(checkpoint vs expected: {bad}); rebuild it with `wb drafter init`"
        )
    net.load_state_dict(state)
    return config
