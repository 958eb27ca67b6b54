"""Shared-prompt packing gives every completion token the logprob it has in its own
prompt + completion row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from actors.messages import SamplingParams, Segment
from actors.models import load_checkpoint
from actors.tiny_model import build_tiny_checkpoint
from learner.packing import shared_prompt_units, unit_size
from learner.trainer import LearnerConfig, Trainer
from tests.learner.segments import scored

RNG = np.random.default_rng(0)


def segment(prompt: np.ndarray, completion_length: int, temperature: float = 1.0) -> Segment:
    base = scored(f"s{RNG.integers(1 << 30)}").segment
    return msgspec.structs.replace(
        base,
        prompt_ids=prompt,
        completion_ids=RNG.integers(0, 256, completion_length).astype(np.int32),
        logprobs=np.zeros(completion_length, dtype=np.float32),
        versions=np.zeros(completion_length, dtype=np.int32),
        sampling=SamplingParams(temperature=temperature),
    )


def prompt(length: int) -> np.ndarray:
    return RNG.integers(0, 256, length).astype(np.int32)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = build_tiny_checkpoint(Path(tmp_path_factory.mktemp("packing")) / "m", seed=3)
    return load_checkpoint(path).model


def unpacked(model: Any, segments: list[Segment], width: int) -> torch.Tensor:
    """Each segment alone: log-softmax of its own row's logits at its temperature."""
    out = torch.zeros(len(segments), width)
    for i, s in enumerate(segments):
        ids = torch.from_numpy(np.concatenate([s.prompt_ids, s.completion_ids]).astype(np.int64))
        logits = model(input_ids=ids[None]).logits[0].float() / s.sampling.temperature
        start = len(s.prompt_ids) - 1
        steps = torch.log_softmax(logits[start : start + len(s.completion_ids)], -1)
        out[i, : len(s.completion_ids)] = steps.gather(1, ids[start + 1 :, None])[:, 0]
    return out


@pytest.mark.parametrize("token_budget", [8192, 40])
def test_packed_logprobs_equal_each_segment_alone(model: Any, token_budget: int) -> None:
    """Two groups with prompts of different lengths, completions of different lengths,
    interleaved, one at another temperature; a budget of 40 tokens splits the groups
    into several rows."""
    first, second = prompt(23), prompt(9)
    segments = [
        segment(first, 5),
        segment(second, 3),
        segment(first, 7, temperature=0.7),
        segment(second, 6),
        segment(first, 1),
        segment(second, 4),
    ]
    width = 7
    trainer = Trainer(model, LearnerConfig(policy="p", token_budget=token_budget))
    with torch.no_grad():
        got = trainer.token_logprobs(segments, width, model)
        want = unpacked(model, segments, width)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_units_group_completions_of_one_prompt_within_the_budget() -> None:
    first, second = prompt(10), prompt(4)
    segments = [segment(first, 3), segment(second, 2), segment(first, 3), segment(first, 3)]
    assert shared_prompt_units(segments, token_budget=100) == [[0, 2, 3], [1]]
    assert shared_prompt_units(segments, token_budget=16) == [[0, 2], [1], [3]]
    assert unit_size(segments, [0, 2]) == 16
    # A completion that alone exceeds the budget still gets a unit of its own.
    assert shared_prompt_units(segments, token_budget=5) == [[0], [1], [2], [3]]


def test_a_packed_step_trains_like_separate_rows(model: Any) -> None:
    """The gradient of the packed forward equals the gradient of the rows run apart."""
    shared = prompt(15)
    segments = [segment(shared, n) for n in (4, 2, 6)]
    trainer = Trainer(model, LearnerConfig(policy="p"))
    grads = []
    for logprobs in (trainer.token_logprobs, lambda s, w, m: unpacked(m, s, w)):
        model.zero_grad(set_to_none=True)
        logprobs(segments, 6, model).sum().backward()
        trained = [q.grad.flatten() for q in model.parameters() if q.grad is not None]
        grads.append(torch.cat(trained))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)
