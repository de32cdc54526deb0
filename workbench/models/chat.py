"""How a task's prompt becomes the token ids a model continues: plain text, or the model's chat template.

    fmt = PromptFormat.resolve(tokenizer, "auto", system_prompt=None)   # chat if the tokenizer has a template
    ids = fmt.encode("What is 2 + 3?")          # <|im_start|>system ... <|im_start|>assistant\\n  (list[int])
    fmt.stop_token_ids(model.generation_config) # (2,): eos and end-of-turn ids that end a completion

Prompts are TRL's two dataset kinds: *standard* (a string) and *conversational* (a list of
``{"role", "content"}`` messages; stored in the workbench's string ``prompt`` column as its JSON
text, see :func:`workbench.tasks.loading.load_task_data`). In chat mode a string becomes one user
message, after ``system_prompt`` if one is set (else the template's own default system turn, if
it has one); the template is rendered as text with the generation prompt and tokenised without
special tokens, as TRL's trainers do, so the ids are exactly what the model saw in chat training.
Plain mode is the embedded presets' convention (:func:`workbench.models.tokenizer.encode_prompt`):
``[bos] + tokens(prompt)``. The completion is what the model generates after the prompt, so the
reward reads the assistant's text only, and the end-of-turn token ends it in both engines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

CHAT_MODES = ("auto", True, False)


def parse_messages(prompt: str) -> list[dict[str, str]] | None:
    """The messages of a conversational prompt stored as JSON text, or None for a plain string prompt."""
    s = prompt.lstrip()
    if not s.startswith("[{"):
        return None
    try:
        msgs = json.loads(s)
    except json.JSONDecodeError:
        return None
    ok = isinstance(msgs, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs)
    return msgs if ok else None


@dataclass(frozen=True)
class PromptFormat:
    """The resolved prompt format of a run: chat template or plain text, and the system prompt."""

    tokenizer: Any  # PreTrainedTokenizerBase
    chat: bool
    system_prompt: str | None = None

    @classmethod
    def resolve(
        cls, tokenizer: PreTrainedTokenizerBase, mode: str | bool = "auto", system_prompt: str | None = None
    ) -> "PromptFormat":
        """``mode``: "auto" (chat iff the tokenizer has a chat template), True or False (task.chat_template).

        Raises ValueError naming task.chat_template if chat is asked for and the tokenizer has no
        template, or if the mode is not one of auto/true/false.
        """
        if mode not in CHAT_MODES:
            raise ValueError(f"task.chat_template: {mode!r}; allowed values: auto, true, false")
        has = bool(getattr(tokenizer, "chat_template", None))
        if mode is True and not has:
            raise ValueError(
                "task.chat_template: true, but the model's tokenizer has no chat template "
                "(tokenizer_config.json / chat_template.jinja); set task.chat_template=false or auto"
            )
        return cls(tokenizer, has if mode == "auto" else bool(mode), system_prompt)

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The conversation for ``prompt`` (a string or JSON messages), with the system prompt if set."""
        msgs = parse_messages(prompt) or [{"role": "user", "content": prompt}]
        if self.system_prompt is not None and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return msgs

    def text(self, prompt: str) -> str:
        """The prompt as the text the model continues (chat template rendered with the generation prompt)."""
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template(self.messages(prompt), tokenize=False, add_generation_prompt=True)

    def encode(self, prompt: str) -> list[int]:
        """Token ids (P,) the model continues. Chat: the rendered template, no special tokens added
        (the template writes its own); plain: ``[bos] + tokens(prompt)`` (no bos if the tokenizer has none)."""
        tok = self.tokenizer
        if self.chat:
            return tok.encode(self.text(prompt), add_special_tokens=False)
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        return bos + tok.encode(prompt, add_special_tokens=False)

    def stop_token_ids(self, generation_config: Any = None) -> tuple[int, ...]:
        """Token ids that end a completion: the tokenizer's eos, the generation config's eos ids
        (Llama 3 instruct lists ``<|eot_id|>`` there) and, in chat mode, the template's end-of-turn
        token if the vocabulary has one of the common ones. Sorted, distinct."""
        tok = self.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        g = getattr(generation_config, "eos_token_id", None)
        ids |= set(g) if isinstance(g, (list, tuple)) else ({g} if g is not None else set())
        if self.chat:
            vocab = tok.get_vocab()
            ids |= {vocab[t] for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>") if t in vocab}
        return tuple(sorted(ids))


def generation_config_of(path) -> Any:
    """The ``generation_config.json`` of a checkpoint folder as a GenerationConfig, or None if it has none."""
    from pathlib import Path

    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(str(path)) if (Path(path) / "generation_config.json").is_file() else None


def run_prompt_format(task_spec: Any, tokenizer: PreTrainedTokenizerBase) -> PromptFormat:
    """The prompt format a run's ``task`` section asks for (task.chat_template, task.system_prompt)."""
    return PromptFormat.resolve(tokenizer, task_spec.chat_template, task_spec.system_prompt)
