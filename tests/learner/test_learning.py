"""The learner learns: a tiny random policy, served by the real torch engine actor and
trained by the real learner actor (weights published back after every step), learns to
answer with the digit it is shown (one of three). Reward: 1 for that digit, 0.1 for
another digit, 0 for anything else, so the first steps, where a digit comes out ~1% of
the time, already have some signal. Sampling at temperature 1.5 keeps exploring once the
policy grows confident.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.engines import EngineActor, open_torch_engine
from actors.messages import Generate, GetLearnerStats, SamplingParams, ScoredSegment, Segment
from actors.models import load_checkpoint
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig
from runtime.testing import open_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROMPTS_PER_STEP = 8
SAMPLES = 8
DIGITS = 3


def reward(digit: str, text: str) -> float:
    if text[:1] == digit:
        return 1.0
    return 0.1 if text[:1].isdigit() else 0.0


@pytest.mark.parametrize(
    "config",
    [
        LearnerConfig(
            policy="digits",
            algorithm="grpo",
            lr=1e-3,
            groups_per_batch=PROMPTS_PER_STEP,
            engines=["engine/digits/0"],
        ),
        LearnerConfig(
            policy="digits",
            algorithm="reinforce_pp",
            lr=4e-4,
            segments_per_batch=PROMPTS_PER_STEP * SAMPLES,
            beta=0.01,
            engines=["engine/digits/0"],
        ),
    ],
    ids=["grpo", "reinforce_pp"],
)
async def test_a_tiny_policy_learns_to_answer_with_the_digit_shown(
    tiny_path: Path, config: LearnerConfig
) -> None:
    torch.manual_seed(0)  # the engine draws its samples from torch's global generator
    engine_checkpoint = load_checkpoint(tiny_path)
    learner_checkpoint = load_checkpoint(tiny_path)
    rng = random.Random(0)
    sampling = SamplingParams(n=SAMPLES, temperature=1.5, max_tokens=1)
    history: list[float] = []
    async with (
        open_cluster("head", "learner") as (head, learner_node),
        open_torch_engine(engine_checkpoint, policy="digits") as core,
    ):
        engine = await head.spawn("engine/digits/0", lambda: EngineActor(core))
        learner = await learner_node.spawn(
            "learner/digits", lambda: LearnerActor(learner_checkpoint.model, config)
        )
        for step in range(400):
            batch_rewards = []
            for p in range(PROMPTS_PER_STEP):
                digit = str(rng.randrange(DIGITS))
                chat = [{"role": "user", "content": f"Say {digit}"}]
                prompt = np.array(engine_checkpoint.render_chat(chat), dtype=np.int32)
                generation = await head.call(
                    engine, Generate(f"{step}-{p}", sampling, prompt_ids=prompt), timeout=60
                )
                for sample in generation.samples:
                    value = reward(digit, sample.text)
                    batch_rewards.append(value)
                    segment = Segment(
                        segment_id=f"{step}-{p}-{sample.index}",
                        episode_id=f"{step}-{p}",
                        sample_id=f"{step}-{p}-{sample.index}",
                        parent_id="",
                        group=f"{step}-{p}",
                        group_size=SAMPLES,
                        role="solver",
                        policy="digits",
                        prompt_ids=sample.prompt_ids,
                        completion_ids=sample.completion_ids,
                        logprobs=sample.logprobs,
                        versions=sample.versions,
                        finish_reason=sample.finish_reason,
                        text=sample.text,
                        sampling=sampling,
                    )
                    await head.send(learner, ScoredSegment(segment, value))
            history.append(float(np.mean(batch_rewards)))
            if len(history) >= 3 and min(history[-3:]) >= 0.9:
                break
        stats = await head.call(learner, GetLearnerStats(), timeout=60)
    assert history[0] < 0.3, history
    assert min(history[-3:]) >= 0.9, history
    assert stats.published == stats.version and stats.rejected == {}
    assert stats.engines == {"engine/digits/0": stats.version}
