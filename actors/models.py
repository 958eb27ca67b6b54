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
    if model.config.vocab_size < len(tokenizer):
        raise CheckpointError(
            f"model path {str(directory)!r}: the tokenizer has {len(tokenizer)} tokens but "
            f"the model's vocabulary only {model.config.vocab_size}"
        )
    return Checkpoint(directory, model, tokenizer)


def parameter_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the checkpoint's model (as its ``state_dict`` names
    them, which is what a learner publishes) with its shape, without loading weights."""
    config = AutoConfig.from_pretrained(check_checkpoint(path), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
