"""Build-time evaluation: a target's sampled task accuracy, a draft's agreement with its target."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from workbench.models.batches import pad_left
from workbench.models.tokenizer import encode_prompt
from workbench.tasks import get_task


@torch.no_grad()
def sampled_accuracy(
    model: LlamaForCausalLM,
    tok: PreTrainedTokenizerFast,
    items: list[dict],
    task_name: str = "arith_chain",
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
) -> float:
    """Mean task reward (0..1) of one sampled completion per item (pure temperature sampling, no top-k/p).

    Uses transformers `generate(do_sample=True)` on left-padded `encode_prompt` batches; the global
    torch RNG is forked so a fixed seed gives the same samples without disturbing the caller.
    Temperature 1 is the RL sampling temperature: the accuracy GRPO starts from.
    """
    task = get_task(task_name)
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total = 0.0
    with torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev]):
        torch.manual_seed(seed)
        for i in range(0, len(items), batch_size):
            chunk = items[i : i + batch_size]
            ids, attn = pad_left([encode_prompt(tok, it["prompt"]) for it in chunk], tok.pad_token_id)
            out = model.generate(
                input_ids=ids.to(dev),
                attention_mask=attn.to(dev),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            texts = tok.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
            total += sum(task.reward(t, it["answer"]) for t, it in zip(texts, chunk))
    model.train(was_training)
    return total / max(1, len(items))


@torch.no_grad()
def draft_agreement(
    student: LlamaForCausalLM, teacher: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Teacher-forced agreement on masked positions of ids [B, T] (mask [B, T-1]).

    top1_agreement: fraction where argmax draft == argmax target (greedy acceptance).
    alpha: mean sum_x min(p(x), q(x)) at temperature 1 (expected acceptance per draft token,
    Leviathan et al. 2023).
    """
    p = F.softmax(teacher(input_ids=ids[:, :-1]).logits.float(), -1)
    q = F.softmax(student(input_ids=ids[:, :-1]).logits.float(), -1)
    n = mask.sum()
    top1 = ((p.argmax(-1) == q.argmax(-1)).float() * mask).sum() / n
    alpha = (torch.minimum(p, q).sum(-1) * mask).sum() / n
    return {"top1_agreement": round(top1.item(), 4), "alpha": round(alpha.item(), 4)}
