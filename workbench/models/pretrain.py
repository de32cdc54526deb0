"""The target recipe: pretrain a Llama (from scratch, or grown from a built target) on gold task text
until a sampled-accuracy target or a step count."""

from __future__ import annotations

import time

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from workbench.models.batches import collate, eval_items, train_items
from workbench.models.config import make_config
from workbench.models.evaluate import draft_agreement, sampled_accuracy
from workbench.models.grow import grow_into
from workbench.models.losses import completion_ce
from workbench.models.presets import ModelPreset
from workbench.models.schedule import adamw, optimizer_step, warmup_cosine
from workbench.progress import progress_bar

EVAL_TEMPERATURE = 1.0  # the RL sampling temperature: the accuracy GRPO starts from
GROWTH_CHECK_TEXTS = 16  # grown targets: held-out texts of the growth check and the source agreement (2 forwards each)


def train_target(
    preset: ModelPreset, tok: PreTrainedTokenizerFast, progress: bool = False, source: LlamaForCausalLM | None = None
) -> tuple[LlamaForCausalLM, dict]:
    """Pretrain a target on gold prompt+solution text; stop at the accuracy target.

    From scratch, or (``r.grow_from``) from ``source``, the built grow_from target, grown
    function-preservingly into the preset's config (:func:`workbench.models.grow.grow_into`) and
    trained on from there; info then also records the growth (``growth``: factors and the max
    |logit difference| from the source on GROWTH_CHECK_TEXTS held-out eval texts before training,
    float tolerance) and ``source_agreement`` after training (top-1 agreement and alpha of the
    trained target with its source on those texts: how far training moved it from a copy).

    Fresh generated examples every step (train partition only, so build-time eval prompts are
    held out). Sampled accuracy (temperature 1) on r.eval_prompts held-out prompts every
    r.eval_every steps and at the last (none with eval_every 0: then only the final eval runs);
    stops once it is >= r.target_accuracy (after r.min_steps) or at r.steps.
    Returns (model in eval mode, info dict for build_info.json: steps, seconds, stop_reason,
    final_loss, eval_accuracy, final_eval_accuracy, eval_history, ...).
    """
    r = preset.recipe
    torch.manual_seed(r.seed)
    model = LlamaForCausalLM(make_config(preset, tok))
    growth = None
    if r.grow_from:
        if source is None:
            raise ValueError(f"preset {preset.name}: grows from {r.grow_from}; pass the built {r.grow_from} as source")
        growth = grow_into(model, source, r.grow_jitter, r.seed)
        growth["max_abs_logit_diff"] = _max_logit_diff(model, source, tok, r.seq_source, GROWTH_CHECK_TEXTS)
    model.train()
    opt = adamw(model.parameters(), r.lr, r.weight_decay)
    sched = warmup_cosine(opt, r.warmup_steps, r.steps)
    evals = eval_items(r.seq_source, r.eval_prompts)
    history, acc, loss_ema, step = [], None, None, 0
    stop_reason = "max_steps"
    t0 = time.time()
    with progress_bar(progress) as bar:
        task = bar.add_task(f"build {preset.name}", total=r.steps, info="")
        for step in range(1, r.steps + 1):
            ids, mask = collate(tok, train_items(r.seq_source, r.batch_size, seed=r.seed * 1_000_003 + step))
            loss = completion_ce(model, ids, mask)
            optimizer_step(model, opt, sched, loss)
            loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
            if r.eval_every and (step % r.eval_every == 0 or step == r.steps):
                acc = sampled_accuracy(model, tok, evals, r.seq_source, r.max_new_tokens, EVAL_TEMPERATURE, seed=r.seed)
                history.append(
                    {"step": step, "loss": round(loss_ema, 4), "accuracy": acc, "seconds": round(time.time() - t0, 1)}
                )
                model.train()
            bar.update(
                task, completed=step, info=f"loss {loss_ema:.3f}" + (f"  eval acc {acc:.2f}" if acc is not None else "")
            )
            if r.target_accuracy is not None and acc is not None and step >= r.min_steps and acc >= r.target_accuracy:
                stop_reason = "target_accuracy"
                break
    model.eval()
    final_acc = None
    if r.final_eval_prompts:  # a tighter estimate than the 64-prompt stop check (std ~ 0.06)
        # prompts other than the stop-check ones, which selected the stopping point (selection bias)
        final_items = eval_items(r.seq_source, r.eval_prompts + r.final_eval_prompts)[r.eval_prompts :]
        final_acc = sampled_accuracy(
            model, tok, final_items, r.seq_source, r.max_new_tokens, EVAL_TEMPERATURE, seed=r.seed + 1
        )
    extra = {}
    if growth is not None:
        ids, mask = collate(tok, eval_items(r.seq_source, GROWTH_CHECK_TEXTS))
        extra = dict(grow_from=r.grow_from, growth=growth, source_agreement=draft_agreement(model, source, ids, mask))
    info = dict(
        steps=step,
        seconds=round(time.time() - t0, 1),
        stop_reason=stop_reason,
        final_loss=round(loss_ema, 4),
        eval_accuracy=acc,
        eval_prompts=len(evals),
        final_eval_accuracy=final_acc,
        final_eval_prompts=r.final_eval_prompts,
        eval_temperature=EVAL_TEMPERATURE,
        target_accuracy=r.target_accuracy,
        eval_history=history,
        **extra,
    )
    return model, info


@torch.no_grad()
def _max_logit_diff(
    model: LlamaForCausalLM, source: LlamaForCausalLM, tok: PreTrainedTokenizerFast, task: str, n: int
) -> float:
    """max |logit(model) - logit(source)| over n held-out gold texts (all positions): 0 up to float
    rounding for a function-preserving growth."""
    ids, _ = collate(tok, eval_items(task, n))
    was = model.training
    model.eval()
    diff = (model(input_ids=ids).logits - source.eval()(input_ids=ids).logits).abs().max().item()
    model.train(was)
    return float(f"{diff:.3g}")
