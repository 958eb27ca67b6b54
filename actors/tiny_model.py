"""Tiny checkpoints for tests and the embedded demo, built here and saved with
``save_pretrained``, so they load through ``load_checkpoint`` (and vLLM) exactly as a
real checkpoint does.

The tokenizer is byte-level (every byte is a token, so any text round-trips) plus the
chat-template special tokens and a few whole words the workflows parse, such as the
Verifier's verdicts. The chat template is ChatML, as Qwen's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

Family = Literal["qwen2", "qwen3", "llama"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", "<think>", "</think>"]
WORDS = ["Correct", "Wrong", "system", "user", "assistant", "\\boxed", "Solver", "Verifier"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_FAMILIES: dict[str, tuple[Any, Any]] = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.add_tokens(WORDS)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token=None,
        unk_token=None,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_checkpoint(
    directory: str | Path,
    *,
    family: Family = "qwen2",
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate_size: int = 256,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised (seeded) float32 model and its tokenizer to
    ``directory``; returns the directory. Head size is ``hidden_size / heads`` (64 by
    default, a size every attention backend supports)."""
    if family not in _FAMILIES:
        raise ValueError(f"family must be one of {sorted(_FAMILIES)}, got {family!r}")
    config_type, model_type = _FAMILIES[family]
    tokenizer = build_tokenizer()
    config = config_type(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = model_type(config)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
