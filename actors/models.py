"""Loading a Hugging Face checkpoint from a local directory: config, tokenizer and
safetensors weights. There is no hub access at run time, so a path that is not a
complete checkpoint fails here, naming what is missing, before any engine starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class CheckpointError(ValueError):
    """A model path that cannot be loaded; the message names the path and the part."""


@dataclass
class Checkpoint:
    path: Path
    model: Any
    tokenizer: PreTrainedTokenizerBase

    def render_chat(self, chat: list[dict[str, str]]) -> list[int]:
        return render_chat(self.tokenizer, chat)


def render_chat(tokenizer: PreTrainedTokenizerBase, chat: list[dict[str, str]]) -> list[int]:
    """Token ids of ``chat`` in the tokenizer's chat template, ready for the reply."""
    if not tokenizer.chat_template:
        raise CheckpointError(f"{tokenizer.name_or_path}: the tokenizer has no chat template")
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def check_checkpoint(path: str | Path) -> Path:
    """The directory, if it holds a config, a tokenizer and safetensors weights."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise CheckpointError(
            f"model path {str(directory)!r} is not a directory (models are loaded from "
            "local paths only; nothing is downloaded)"
        )
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"model path {str(directory)!r} has no config.json")
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise CheckpointError(
            f"model path {str(directory)!r} has no tokenizer (looked for "
            f"{', '.join(_TOKENIZER_FILES)})"
        )
    if not any(directory.glob("*.safetensors")):
        raise CheckpointError(f"model path {str(directory)!r} has no *.safetensors weights")
    return directory


def load_checkpoint(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> Checkpoint:
    """Load the causal LM and its tokenizer from a local checkpoint directory."""
    directory = check_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=dtype)
    model.to(torch.device(device))
    model.train(False)
    _check_vocabulary(directory, model.config.vocab_size, len(tokenizer))
    return Checkpoint(directory, model, tokenizer)


def check_model(path: str | Path) -> Path:
    """``check_checkpoint``, and that every token of the tokenizer has a row in the
    model's embedding: read from the config, so no weights are loaded. A launcher runs
    it before it starts anything, so a checkpoint paired with another model's tokenizer
    is an error naming the path rather than an engine dying on an index."""
    directory = check_checkpoint(path)
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"model path {str(directory)!r}: {error}") from None
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    if isinstance(vocab_size, int):
        _check_vocabulary(directory, vocab_size, len(tokenizer))
    return directory


def _check_vocabulary(directory: Path, vocab_size: int, tokens: int) -> None:
    if vocab_size < tokens:
        raise CheckpointError(
            f"model path {str(directory)!r}: the tokenizer has {tokens} tokens but the "
            f"model's vocabulary only {vocab_size}"
        )


def parameter_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the checkpoint's model (as its ``state_dict`` names
    them, which is what a learner publishes) with its shape, without loading weights."""
    config = AutoConfig.from_pretrained(check_checkpoint(path), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
