"""The shared byte-level BPE tokenizer, and the project's prompt/completion encoding convention.

Convention (every stage uses exactly this, so training text and generation agree):
    prompt ids      = [bos] + tokens(prompt)                  (prompt ends with "\\n")
    completion ids  = tokens(completion), decoded with decode(ids, skip_special_tokens=True)
    pretraining ids = [bos] + tokens(prompt) + tokens(solution) + [eos]
Prompt and solution are tokenised separately and concatenated; the pre-tokenizer splits at the
"\\n" that ends every prompt anyway, so this equals what a model sees when it continues a prompt.

Digits are split into single tokens so arithmetic is learnable; byte-level BPE makes
decode(encode(x)) == x for any text (spaces and newlines included).
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2
TOKENIZER_VERSION = 1  # bump when the recipe below changes: it invalidates cached tokenizers/models


def build_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on texts. Deterministic for the same texts and vocab_size.

    Returns a PreTrainedTokenizerFast with pad/bos/eos set (ids 0/1/2), left padding (for
    batched generation) and no automatic special tokens: callers add bos/eos explicitly.
    Raises ValueError if vocab_size cannot hold the 256 byte symbols plus special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE(unk_token=None))
    # Digits first so "123" -> "1","2","3"; ByteLevel then maps bytes and splits words/spaces.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable -> exact round-trip
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """HF wrapper around a `tokenizers.Tokenizer` with the project's special tokens."""
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    hf.padding_side = "left"
    return hf


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """[bos] + tokens(prompt): the ids a model continues at generation time."""
    return [tokenizer.bos_token_id] + encode_text(tokenizer, prompt)


def encode_text(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """tokens(text) with no special tokens added."""
    return tokenizer.encode(text, add_special_tokens=False)


def encode_example(tokenizer: PreTrainedTokenizerFast, prompt: str, completion: str) -> tuple[list[int], int]:
    """Pretraining ids [bos] + tokens(prompt) + tokens(completion) + [eos], and the prompt length.

    The prompt length (bos included) is the index of the first completion token, for losses on
    completion tokens only.
    """
    p = encode_prompt(tokenizer, prompt)
    return p + encode_text(tokenizer, completion) + [tokenizer.eos_token_id], len(p)


def decode_completion(tokenizer: PreTrainedTokenizerFast, ids: Iterable[int]) -> str:
    """Completion text from generated ids (special tokens such as eos/pad dropped)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)
