"""Embedded model presets: Llama targets pretrained on arith_chain and drafts distilled from them.

A preset is a LlamaConfig (architecture) plus a build recipe (how to train it from scratch in the
cache). Targets stop pretraining as soon as their *sampled* accuracy (temperature 1.0, the RL
sampling temperature) reaches `target_accuracy`, so GRPO starts from a reward that is neither 0
nor saturated. Drafts are distilled from their `distill_from` target with forward KL.

| preset       | role   | layers x hidden | params  | for                                   |
|--------------|--------|-----------------|---------|---------------------------------------|
| micro        | target | 2 x 64          | ~0.1 M  | the test suite (builds in seconds)    |
| micro-draft  | draft  | 1 x 64          | ~0.1 M  | the test suite                        |
| tiny         | target | 4 x 128         | ~0.85 M | laptop CPU experiments (default)      |
| tiny-draft   | draft  | 1 x 128         | ~0.26 M | laptop CPU experiments (default)      |
| tiny-long    | target | 4 x 128         | ~0.85 M | the long-tail workload (arith_chain_long) |
| tiny-long-draft | draft | 1 x 128        | ~0.26 M | the long-tail workload                |
| small        | target | 12 x 768        | ~104 M  | GPUs (slow to build on CPU)           |
| small-draft  | draft  | 2 x 768         | ~18 M   | GPUs                                  |

micro, micro-draft, tiny and tiny-draft ship built in the package (workbench/models/weights/,
refreshed by `python -m workbench.models.ship`), so neither the test suite nor a first `wb run`
builds them; small/small-draft are built on first use. tiny is sized so a build (target + draft)
takes ~5-8 minutes on a 2-core CPU: a 4 x 128 model reached 30 % sampled accuracy after ~850
steps of batch 32 (measured); 6 x 128 learned no faster per step at 1.5x the cost per step, and
6 x 192 costs 2.3x per step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

# Shared by every preset; per-preset `config` entries override or extend it.
BASE_CONFIG: dict[str, Any] = dict(
    tie_word_embeddings=True,
    rope_theta=10000.0,
    attention_bias=False,
    mlp_bias=False,
    hidden_act="silu",
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.02,
)


@dataclass(frozen=True)
class Recipe:
    """How a preset is trained from scratch. Units: steps are optimiser steps, lr is peak AdamW lr.

    Targets: next-token cross-entropy on arith_chain completions (prompt tokens are context only)
    with fresh generated examples every step; linear warmup then cosine decay to 10 % of lr
    (transformers' schedule, see workbench.models.schedule);
    every `eval_every` steps, sampled accuracy on `eval_prompts` held-out prompts; stop at
    `target_accuracy` (None = train all `steps`; eval_every 0: no evaluation before the final one).
    Grown targets (`grow_from`): the built `grow_from` target grown function-preservingly into this
    config (workbench.models.grow) is where training starts.
    Drafts: forward KL(target || draft) at temperature 1 on the same kind of text, teacher-forced
    on the gold prompt+solution (the target is never sampled during distillation), starting from
    the target's embeddings and first layers where the shapes match.
    """

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 20
    weight_decay: float = 0.0
    seq_source: str = "arith_chain"  # text the model is trained on (task name)
    distill_from: str | None = None  # drafts: the target preset whose logits are matched
    target_accuracy: float | None = None  # targets: stop once sampled eval accuracy >= this
    min_steps: int = 0  # don't stop on accuracy before this many steps
    eval_every: int = 50
    eval_prompts: int = 64
    final_eval_prompts: int = 0  # targets: a larger held-out eval after training, for build_info (0 = off)
    max_new_tokens: int = 96
    seed: int = 0
    grow_from: str | None = None  # targets: start from this target preset grown into the config (workbench.models.grow)
    grow_jitter: float = 0.1  # grow_from: relative spread of the split fractions (symmetry breaking; 0 = even)


# Recipe fields added after presets were shipped: hashed only when they are in use (grow_from set),
# so adding them left every existing preset's hash, and its shipped folder, as it was.
GROW_FIELDS = ("grow_from", "grow_jitter")


@dataclass(frozen=True)
class ModelPreset:
    name: str
    role: Literal["target", "draft"]
    config: dict[str, Any]  # LlamaConfig kwargs on top of BASE_CONFIG (vocab/special ids come from the tokenizer)
    recipe: Recipe
    description: str = ""

    @property
    def distill_from(self) -> str | None:
        return self.recipe.distill_from

    def config_kwargs(self) -> dict[str, Any]:
        """LlamaConfig kwargs without the tokenizer-dependent fields (vocab_size, token ids)."""
        return {**BASE_CONFIG, **self.config}

    def to_dict(self) -> dict[str, Any]:
        recipe = asdict(self.recipe)
        if recipe["grow_from"] is None:
            for f in GROW_FIELDS:
                del recipe[f]
        return {"name": self.name, "role": self.role, "config": self.config_kwargs(), "recipe": recipe}


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> dict[str, Any]:
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
    )


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset(
            "micro",
            "target",
            _llama(64, 2, 4, 2, 128),
            Recipe(steps=30, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=30, eval_prompts=8, max_new_tokens=64),
            "test-suite target: trains 30 steps, no accuracy target",
        ),
        ModelPreset(
            "micro-draft",
            "draft",
            _llama(64, 1, 4, 2, 128),
            Recipe(steps=30, batch_size=16, lr=3e-3, warmup_steps=5, distill_from="micro", eval_prompts=16),
            "test-suite draft distilled from micro",
        ),
        ModelPreset(
            "tiny",
            "target",
            _llama(128, 4, 4, 2, 384),
            Recipe(
                steps=1200,
                batch_size=32,
                lr=3e-3,
                warmup_steps=30,
                target_accuracy=0.30,
                min_steps=100,
                eval_every=50,
                final_eval_prompts=256,
            ),
            "laptop-CPU target: pretrained until ~30 % sampled accuracy on arith_chain",
        ),
        ModelPreset(
            "tiny-draft",
            "draft",
            _llama(128, 1, 4, 2, 384),
            Recipe(steps=500, batch_size=32, lr=3e-3, warmup_steps=20, distill_from="tiny", eval_prompts=128),
            "laptop-CPU draft: 1 layer distilled from tiny",
        ),
        ModelPreset(
            "tiny-long",
            "target",
            _llama(128, 4, 4, 2, 384),
            Recipe(
                steps=1500,
                batch_size=32,
                lr=3e-3,
                warmup_steps=30,
                seq_source="arith_chain_long",
                target_accuracy=0.15,
                min_steps=400,
                eval_every=100,
                eval_prompts=64,
                final_eval_prompts=128,
                max_new_tokens=192,
            ),
            "long-tail CPU target (issue #8): tiny's shape pretrained on arith_chain_long (1-16 steps) until ~15 % "
            "sampled accuracy",
        ),
        ModelPreset(
            "tiny-long-draft",
            "draft",
            _llama(128, 1, 4, 2, 384),
            Recipe(
                steps=500,
                batch_size=32,
                lr=3e-3,
                warmup_steps=20,
                seq_source="arith_chain_long",
                distill_from="tiny-long",
                eval_prompts=128,
                max_new_tokens=192,
            ),
            "long-tail CPU draft: 1 layer distilled from tiny-long",
        ),
        ModelPreset(
            "membound",
            "target",
            _llama(512, 8, 16, 8, 1536),
            Recipe(
                steps=24,
                batch_size=16,
                lr=1e-4,
                warmup_steps=8,
                eval_every=24,
                eval_prompts=64,
                final_eval_prompts=128,
                grow_from="tiny",
                grow_jitter=0.1,
            ),
            "memory-bound CPU target (issue #22, ~25 M params): tiny grown 4x wider, 2x deeper (Net2Net), then "
            "trained on",
        ),
        ModelPreset(
            "membound-draft",
            "draft",
            _llama(512, 1, 16, 8, 1536),
            Recipe(steps=100, batch_size=16, lr=3e-3, warmup_steps=10, distill_from="membound", eval_prompts=128),
            "memory-bound CPU draft: 1 layer distilled from membound",
        ),
        ModelPreset(
            "small",
            "target",
            _llama(768, 12, 12, 4, 3072),
            Recipe(
                steps=3000,
                batch_size=64,
                lr=6e-4,
                warmup_steps=100,
                target_accuracy=0.30,
                min_steps=200,
                eval_every=100,
                final_eval_prompts=512,
            ),
            "GPU target (~100 M params): pretrained until ~30 % sampled accuracy",
        ),
        ModelPreset(
            "small-draft",
            "draft",
            _llama(768, 2, 12, 4, 3072),
            Recipe(steps=1000, batch_size=64, lr=6e-4, warmup_steps=50, distill_from="small", eval_prompts=256),
            "GPU draft: 2 layers distilled from small",
        ),
    ]
}


def get_preset(name: str) -> ModelPreset:
    """The preset called name. Raises ValueError listing the preset names if unknown."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def count_params(preset: ModelPreset, vocab_size: int = 512) -> int:
    """Parameter count from the config alone (no weights built), tied embeddings counted once.

    Units: parameters. Matches `sum(p.numel() for p in model.parameters())` of the built model.
    """
    c = preset.config_kwargs()
    h, L, i = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    q = c["num_attention_heads"] * head_dim
    kv = c["num_key_value_heads"] * head_dim
    attn = h * q + 2 * h * kv + q * h
    mlp = 3 * h * i
    norms = 2 * h
    emb = vocab_size * h * (1 if c["tie_word_embeddings"] else 2)
    return L * (attn + mlp + norms) + emb + h  # + final norm
