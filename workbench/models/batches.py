"""Build-time data: fresh generated train items, held-out eval items, and their token batches.

Train items come from the task generator with eval-partition prompts dropped
(:func:`workbench.tasks.is_eval_prompt`), so no build-time eval prompt (nor any GRPO eval prompt)
is ever trained on.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from workbench.tasks import get_task, is_eval_prompt
from workbench.tasks.loading import generate_split

EVAL_SEED = 99991  # generator seed of the held-out prompts used while building


def train_items(task_name: str, n: int, seed: int) -> list[dict]:
    """n fresh generated items from the train partition (eval-partition prompts dropped)."""
    items = [it for it in get_task(task_name).generate(2 * n, seed) if not is_eval_prompt(it["prompt"])]
    return items[:n]


def eval_items(task_name: str, n: int) -> list[dict]:
    """n held-out items (eval partition, fixed seed EVAL_SEED) for build-time evaluation."""
    return generate_split(task_name, "eval", n, EVAL_SEED)


def collate(tok: PreTrainedTokenizerFast, items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded pretraining batch. Returns ids [B, T] and loss mask [B, T-1] (float).

    ids[b] = [bos] + tokens(prompt) + tokens(solution) + [eos] + pad...; mask[b, t] = 1 where
    ids[b, t+1] is a completion token (solution or eos): the model is scored on completions only.
    Right padding needs no attention mask: causal attention never lets real tokens see the pads.
    """
    prompts = tok([it["prompt"] for it in items], add_special_tokens=False)["input_ids"]
    sols = tok([it["solution"] for it in items], add_special_tokens=False)["input_ids"]
    seqs = [[tok.bos_token_id] + p + s + [tok.eos_token_id] for p, s in zip(prompts, sols)]
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T - 1)
    for b, (seq, p) in enumerate(zip(seqs, prompts)):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, len(p) : len(seq) - 1] = 1.0  # targets at positions 1+len(p) .. len(seq)-1
    return ids, mask


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists for batched generation. Returns ids [B, T] and attention mask [B, T]."""
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, T - len(s) :] = torch.tensor(s, dtype=torch.long)
        attn[b, T - len(s) :] = 1
    return ids, attn
