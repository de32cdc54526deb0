"""The draft recipe: distil a small Llama from its target with forward KL, starting from the target's layers."""

from __future__ import annotations

import time

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from workbench.models.batches import collate, eval_items, train_items
from workbench.models.config import make_config
from workbench.models.evaluate import draft_agreement
from workbench.models.losses import forward_kl
from workbench.models.presets import ModelPreset
from workbench.models.schedule import adamw, optimizer_step, warmup_cosine
from workbench.progress import progress_bar

SEED_OFFSET = 500_000  # draft batches differ from the target's pretraining batches of the same seed


def distill_draft(
    preset: ModelPreset, tok: PreTrainedTokenizerFast, teacher: LlamaForCausalLM, progress: bool = False
) -> tuple[LlamaForCausalLM, dict]:
    """Distil a draft from a target with forward KL(target || draft) at temperature 1.

    Teacher-forced on gold prompt+solution text of the recipe's task (the target is not sampled;
    its logits on gold text are the soft labels), on completion positions only: the positions a
    drafter proposes at. The draft starts from the target's weights where shapes allow (see
    `init_from_teacher`). Returns (model in eval mode, info) with top-1 agreement and alpha on
    held-out text.
    """
    r = preset.recipe
    torch.manual_seed(r.seed)
    model = LlamaForCausalLM(make_config(preset, tok))
    copied = init_from_teacher(model, teacher)
    teacher.eval()
    model.train()
    opt = adamw(model.parameters(), r.lr, r.weight_decay)
    sched = warmup_cosine(opt, r.warmup_steps, r.steps)
    loss_ema, t0 = None, time.time()
    with progress_bar(progress) as bar:
        task = bar.add_task(f"build {preset.name}", total=r.steps, info="")
        for step in range(1, r.steps + 1):
            ids, mask = collate(
                tok, train_items(r.seq_source, r.batch_size, seed=r.seed * 1_000_003 + SEED_OFFSET + step)
            )
            with torch.no_grad():
                t_logits = teacher(input_ids=ids[:, :-1]).logits
            loss = forward_kl(model(input_ids=ids[:, :-1]).logits, t_logits, mask)
            optimizer_step(model, opt, sched, loss)
            loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
            bar.update(task, completed=step, info=f"kl {loss_ema:.3f}")
    model.eval()
    ids, mask = collate(tok, eval_items(r.seq_source, r.eval_prompts))
    agree = draft_agreement(model, teacher, ids, mask)
    info = dict(
        steps=r.steps,
        seconds=round(time.time() - t0, 1),
        final_kl=round(loss_ema, 4),
        init_tensors_from_target=len(copied),
        eval_texts=r.eval_prompts,
        **agree,
    )
    return model, info


@torch.no_grad()
def init_from_teacher(student: LlamaForCausalLM, teacher: LlamaForCausalLM) -> list[str]:
    """Copy the target's embeddings, final norm and first layers into a draft where shapes match.

    A draft whose layers start as the target's first layers (an early-exit view of the target)
    distils much faster: for tiny-draft, alpha 0.81 after 400 steps vs 0.68 from scratch (0.76
    after 1000). Returns the names of the copied tensors (empty if nothing matched).
    """
    t_state = teacher.state_dict()
    copied = []
    for name, w in student.state_dict().items():
        src = t_state.get(name)  # layer i of the draft <- layer i of the target; lm_head is tied
        if src is not None and src.shape == w.shape:
            w.copy_(src)
            copied.append(name)
    return copied
