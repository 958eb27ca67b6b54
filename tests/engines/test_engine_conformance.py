"""The contract every engine keeps, run against each engine kind on the tiny model:
generation, n > 1 and seeds, stop strings, logprobs that the learner's recomputation
reproduces, weight updates in flight with per-token versions, and bad requests
refused with an error that names the field."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

from actors.engines import BadRequest, EngineCore
from actors.messages import ChatTurn, Generate, Sample, SamplingParams, Segment
from actors.models import Checkpoint
from actors.sampling import processed_logprobs
from learner.trainer import LearnerConfig, Trainer

pytestmark = pytest.mark.anyio

PROMPT = np.array([257, 265, 198, 16, 10, 16, 28, 258, 198, 257, 266, 198], dtype=np.int32)


def request(request_id: str = "r", **sampling: object) -> Generate:
    return Generate(request_id, SamplingParams(**sampling), prompt_ids=PROMPT)  # type: ignore[arg-type]


def recompute(model: torch.nn.Module, sample: Sample, sampling: SamplingParams) -> torch.Tensor:
    """The learner's side: the logprob of every completion token, from one full forward."""
    ids = np.concatenate([sample.prompt_ids, sample.completion_ids]).astype(np.int64)
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids)[None]).logits[0, len(sample.prompt_ids) - 1 : -1]
    logprobs = processed_logprobs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return logprobs.gather(1, torch.from_numpy(sample.completion_ids.astype(np.int64))[:, None])[
        :, 0
    ]


def argmax_loop(model: torch.nn.Module, prompt: np.ndarray, steps: int) -> list[int]:
    """Greedy tokens by a plain loop over full forwards: no cache, no batching."""
    ids = torch.from_numpy(prompt.astype(np.int64))[None]
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            token = int(model(ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


async def test_n_samples_come_back_whole(engine: EngineCore) -> None:
    samples = await engine.generate(request(n=4, temperature=1.0, max_tokens=12, seed=3))
    assert [s.index for s in samples] == [0, 1, 2, 3]
    for s in samples:
        assert np.array_equal(s.prompt_ids, PROMPT)
        assert 1 <= len(s.completion_ids) <= 12
        assert len(s.logprobs) == len(s.versions) == len(s.completion_ids)
        assert s.finish_reason in ("stop", "length")
        assert np.all(s.logprobs <= 0) and np.all(np.isfinite(s.logprobs))
        assert np.all(s.versions == engine.version)
        assert 0 <= s.timings.queued <= s.timings.first_token <= s.timings.finished
    assert len({s.completion_ids.tobytes() for s in samples}) > 1, "n samples were all alike"


async def test_a_seed_reproduces_the_samples_whatever_shares_the_batch(engine: EngineCore) -> None:
    seeded = request("seeded", n=3, temperature=0.9, top_p=0.95, max_tokens=10, seed=11)
    alone = await engine.generate(seeded)
    async with anyio.create_task_group() as tasks:
        for i in range(4):
            tasks.start_soon(engine.generate, request(f"noise{i}", n=2, max_tokens=8 + i))
        crowded = await engine.generate(seeded)
    assert [s.completion_ids.tolist() for s in crowded] == [
        s.completion_ids.tolist() for s in alone
    ]


async def test_greedy_equals_a_plain_argmax_loop(engine: EngineCore, reference: Checkpoint) -> None:
    (sample,) = await engine.generate(request(temperature=0.0, max_tokens=16))
    expected = argmax_loop(reference.model, PROMPT, len(sample.completion_ids))
    assert sample.completion_ids.tolist() == expected


async def test_requests_joining_and_leaving_the_batch_each_match_their_argmax_loop(
    engine: EngineCore, reference: Checkpoint
) -> None:
    """Prompts of different lengths (left padding) and lengths (rows leave early), some
    admitted while others are mid-generation: each equals its own uncached loop."""
    prompts = [PROMPT[:3], PROMPT, PROMPT[2:10], PROMPT[5:]]
    results: dict[int, Sample] = {}

    async def greedy(i: int, max_tokens: int) -> None:
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        (results[i],) = await engine.generate(Generate(f"g{i}", sampling, prompt_ids=prompts[i]))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(greedy, 0, 20)
        tasks.start_soon(greedy, 1, 6)
        with anyio.fail_after(60):
            while engine.statistics().running == 0:  # noqa: ASYNC110
                await anyio.sleep(0.001)  # the first rows are decoding: join them
        tasks.start_soon(greedy, 2, 14)
        tasks.start_soon(greedy, 3, 9)
    for i, sample in results.items():
        expected = argmax_loop(reference.model, prompts[i], len(sample.completion_ids))
        assert sample.completion_ids.tolist() == expected, f"request {i}"


async def test_logprobs_agree_with_the_learners_recomputation(
    engine: EngineCore, reference: Checkpoint
) -> None:
    """One batch through the learner's own recomputation, ``Trainer.token_logprobs``:
    rows of two prompt lengths, several completion lengths, greedy, T=1 and
    T=0.8/top-p/top-k side by side."""
    samplings = [
        SamplingParams(n=1, temperature=0.0, max_tokens=24),
        SamplingParams(n=3, temperature=1.0, max_tokens=24, seed=5),
        SamplingParams(n=3, temperature=0.8, top_p=0.9, top_k=20, max_tokens=9, seed=6),
    ]
    segments = []
    for i, sampling in enumerate(samplings):
        for prompt in (PROMPT, PROMPT[3:]):
            for s in await engine.generate(Generate(f"lp{i}", sampling, prompt_ids=prompt)):
                segments.append(segment_of(s, sampling))
    assert len({len(s.completion_ids) for s in segments}) > 1
    trainer = Trainer(reference.model, LearnerConfig(policy="solver"))
    width = max(len(s.completion_ids) for s in segments)
    with torch.inference_mode():
        recomputed = trainer.token_logprobs(segments, width, reference.model)
    for row, segment in enumerate(segments):
        n = len(segment.completion_ids)
        delta = (recomputed[row, :n] - torch.from_numpy(segment.logprobs)).abs()
        assert float(delta.max()) <= 1e-4, (segment.sampling, float(delta.max()))
        assert not recomputed[row, n:].any()


def segment_of(sample: Sample, sampling: SamplingParams) -> Segment:
    return Segment(
        segment_id=f"{len(sample.prompt_ids)}-{sample.index}",
        episode_id="e",
        sample_id="s",
        parent_id="",
        group="g",
        group_size=1,
        role="solver",
        policy="solver",
        prompt_ids=sample.prompt_ids,
        completion_ids=sample.completion_ids,
        logprobs=sample.logprobs,
        versions=sample.versions,
        finish_reason=sample.finish_reason,
        sampling=sampling,
    )


async def test_stop_string_ends_the_text_before_it(engine: EngineCore) -> None:
    (free,) = await engine.generate(request(temperature=0.0, max_tokens=24))
    stop = next(c for c in free.text[1:] if c.isascii() and c.isprintable())
    (cut,) = await engine.generate(request(temperature=0.0, max_tokens=24, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.completion_ids.tolist() == free.completion_ids[: len(cut.completion_ids)].tolist()


async def test_chat_is_rendered_with_the_chat_template(
    engine: EngineCore, checkpoint: Checkpoint
) -> None:
    chat = [ChatTurn("user", "1+1=")]
    (sample,) = await engine.generate(
        Generate("chat", SamplingParams(temperature=0.0, max_tokens=4), chat=chat)
    )
    assert sample.prompt_ids.tolist() == checkpoint.render_chat(
        [{"role": "user", "content": "1+1="}]
    )
    assert sample.prompt_ids.tolist() == PROMPT.tolist()


def perturbed(checkpoint: Checkpoint, seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (name, tensor + 0.5 * torch.randn(tensor.shape, generator=generator))
        for name, tensor in checkpoint.model.state_dict().items()
    ]


async def test_weights_update_in_flight_and_tokens_carry_their_version(
    engine: EngineCore, reference: Checkpoint
) -> None:
    before, tokens_before = engine.version, engine.statistics().generated_tokens
    new_weights = perturbed(reference, seed=1)
    long = request("long", n=2, temperature=1.0, max_tokens=120, seed=2)
    result: list[Sample] = []

    async def generate_long() -> None:
        result.extend(await engine.generate(long))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(generate_long)
        with anyio.fail_after(60):
            while engine.statistics().generated_tokens < tokens_before + 20:  # noqa: ASYNC110
                await anyio.sleep(0.005)  # the engine computes in a thread: poll its progress
        pause = await engine.update_weights(before + 1, new_weights)
    assert pause >= 0 and engine.version == before + 1
    for s in result:
        versions = s.versions.tolist()
        assert versions == sorted(versions), "versions went backwards within a sample"
        assert versions[0] == before and versions[-1] == before + 1, versions
    reference.model.load_state_dict(dict(new_weights))
    (greedy,) = await engine.generate(request(temperature=0.0, max_tokens=16))
    assert np.all(greedy.versions == before + 1)
    assert greedy.completion_ids.tolist() == argmax_loop(
        reference.model, PROMPT, len(greedy.completion_ids)
    )
    delta = recompute(reference.model, greedy, SamplingParams(temperature=0.0)) - torch.from_numpy(
        greedy.logprobs
    )
    assert float(delta.abs().max()) <= 1e-4


async def test_a_bad_weight_update_changes_nothing(
    engine: EngineCore, reference: Checkpoint
) -> None:
    before = engine.version
    (name, tensor), *_ = reference.model.state_dict().items()
    with pytest.raises(ValueError, match="no_such_weight"):
        await engine.update_weights(before + 1, [(name, tensor + 1), ("no_such_weight", tensor)])
    with pytest.raises(ValueError, match=name):
        await engine.update_weights(before + 1, [(name, tensor[:1])])
    assert engine.version == before
    (sample,) = await engine.generate(request(temperature=0.0, max_tokens=8))
    assert (
        sample.completion_ids.tolist()
        == argmax_loop(reference.model, PROMPT, 8)[: len(sample.completion_ids)]
    )


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (request(n=0), "n"),
        (request(n=2, temperature=0.0), "n must be 1"),
        (request(temperature=-1.0), "temperature"),
        (request(top_p=1.5), "top_p"),
        (request(top_k=-2), "top_k"),
        (request(max_tokens=0), "max_tokens"),
        (request(stop=[""]), "stop"),
        (Generate("x", prompt_ids=np.array([1, 99999], dtype=np.int32)), "prompt_ids"),
        (Generate("x", prompt_ids=np.zeros((2, 2), dtype=np.int32)), "prompt_ids"),
        (Generate("x"), "empty prompt"),
        (Generate("x", SamplingParams(max_tokens=1020), prompt_ids=PROMPT), "positions"),
    ],
)
async def test_bad_requests_are_refused_naming_the_field(
    engine: EngineCore, bad: Generate, field: str
) -> None:
    with pytest.raises(BadRequest, match=field):
        await engine.generate(bad)
    (sample,) = await engine.generate(request(max_tokens=2))
    assert len(sample.completion_ids) >= 1
