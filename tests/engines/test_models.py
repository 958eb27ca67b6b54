"""Checkpoints load from local paths only, and an incomplete one is refused naming the
part that is missing; the tiny models of every family load and generate."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from actors.engines import open_torch_engine
from actors.messages import Generate, SamplingParams
from actors.models import CheckpointError, load_checkpoint, parameter_shapes
from actors.tiny_model import WORDS, build_tiny_checkpoint, build_tokenizer


def copy_without(source: Path, target: Path, *patterns: str) -> Path:
    shutil.copytree(source, target)
    for pattern in patterns:
        for path in target.glob(pattern):
            path.unlink()
    return target


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        (("config.json",), "config.json"),
        (("tokenizer.json",), "tokenizer"),
        (("*.safetensors",), "safetensors"),
    ],
)
def test_an_incomplete_checkpoint_is_refused_naming_the_part(
    tiny_path: Path, tmp_path: Path, missing: tuple[str, ...], named: str
) -> None:
    broken = copy_without(tiny_path, tmp_path / "broken", *missing)
    with pytest.raises(CheckpointError, match=named):
        load_checkpoint(broken)


def test_a_path_that_does_not_exist_is_refused_without_any_download(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="local paths only"):
        load_checkpoint(tmp_path / "Qwen/Qwen3-4B")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(
    tiny_path: Path, tmp_path: Path
) -> None:
    mismatched = copy_without(tiny_path, tmp_path / "mismatched", "tokenizer*", "chat_template*")
    tokenizer = build_tokenizer()
    tokenizer.add_tokens([f"extra{i}" for i in range(8)])
    tokenizer.save_pretrained(mismatched)
    with pytest.raises(CheckpointError, match="vocabulary"):
        load_checkpoint(mismatched)


def test_the_tokenizer_round_trips_text_and_keeps_the_verdict_words_whole() -> None:
    tokenizer = build_tokenizer()
    text = "Verifier: the answer \\boxed{3/4} is Wrong. é"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    for word in WORDS:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
async def test_every_family_loads_and_generates(family: str, tmp_path: Path) -> None:
    path = build_tiny_checkpoint(tmp_path / family, family=family)  # type: ignore[arg-type]
    checkpoint = load_checkpoint(path)
    assert parameter_shapes(path) == {
        name: tuple(t.shape) for name, t in checkpoint.model.state_dict().items()
    }
    async with open_torch_engine(checkpoint, policy=family) as engine:
        prompt = np.array(checkpoint.render_chat([{"role": "user", "content": "2+2="}]), np.int32)
        request = Generate("f", SamplingParams(n=2, max_tokens=6, seed=1), prompt_ids=prompt)
        samples = await engine.generate(request)
    assert [len(s.completion_ids) > 0 for s in samples] == [True, True]
