"""Simulated compute for the pipeline-under-load suite: an engine core whose samples take
a long-tailed time to generate, and a learner whose steps take a fixed time. Everything
around them is the real pipeline: engine and learner actors, agents, the conductor and
its MarsRL workflow, rewards, messages, credit and weight publication.

The engine core draws each sample's length from a log-normal distribution (the long
tail of reasoning lengths) and decodes it at a fixed per-sequence rate, up to
``slots`` sequences at once, as a continuously batched engine whose decode step time
does not grow with its batch. Each token carries the version the engine held when it
was produced, so staleness is measured as it would be on real engines. The text it
answers with is short and parseable by every MarsRL role (an answer in ``\\boxed{}``
and a verdict), right or wrong at random; its token ids are random.

The learner is the real ``LearnerActor`` (admission, grouping into GRPO batches,
bookkeeping, weight publication to the engines as bucket messages); only its optimizer
step is replaced by a blocking sleep in the same worker thread.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import msgspec
import numpy as np
import torch

from actors.engines.base import check_weights, request_prompt
from actors.messages import (
    EngineStats,
    Generate,
    Problem,
    Sample,
    SampleTimings,
    ScoredSegment,
    Segment,
)
from actors.models import Checkpoint
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig, Trainer


class Workload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The simulated compute; times in seconds."""

    median_tokens: float = 128.0
    """Median completion length; lengths are log-normal around it."""
    sigma: float = 1.0
    """Log-normal shape: 0 makes every completion ``median_tokens`` long; 1 puts the
    99th percentile at about 10 times the median."""
    max_tokens: int = 2048
    decode_tokens_per_s: float = 512.0
    """Per sequence: a completion of n tokens takes n / this."""
    slots: int = 128
    """Sequences one engine decodes at once; more wait for a slot."""
    update_pause_s: float = 0.01
    """Generation stands still this long to apply a weight version."""
    step_s: float = 1.0
    """One learner optimizer step, whatever the batch."""
    correct: float = 0.5
    """Chance that a sample's answer (and, independently, its verdict) is right."""


def sample_lengths(workload: Workload, count: int, rng: np.random.Generator) -> np.ndarray:
    """Completion lengths of ``count`` samples: log-normal, clipped to 1..max_tokens."""
    drawn = workload.median_tokens * np.exp(workload.sigma * rng.standard_normal(count))
    return np.clip(np.rint(drawn), 1, workload.max_tokens).astype(np.int64)


class SimulatedEngine:
    """An ``EngineCore`` that spends simulated decode time instead of running a model.
    Prompts are rendered and checked with the checkpoint's tokenizer like a real
    engine's, and weight updates are checked against the checkpoint's shapes."""

    kind = "simulated"

    def __init__(
        self, checkpoint: Checkpoint, workload: Workload, *, policy: str, seed: int = 0
    ) -> None:
        self.policy = policy
        self.workload = workload
        self.version = 0
        self.shapes = {n: tuple(t.shape) for n, t in checkpoint.model.state_dict().items()}
        self._checkpoint = checkpoint
        self._vocab = int(checkpoint.model.config.vocab_size)
        self._positions = int(checkpoint.model.config.max_position_embeddings)
        self._rng = np.random.default_rng(seed)
        self._slots = anyio.CapacityLimiter(workload.slots)
        self._updates: list[float] = []
        """When each version after 0 was applied: version v holds from ``_updates[v-1]``."""
        self._running = 0
        self._waiting = 0
        self._tokens = 0
        self._last_pause = 0.0

    async def generate(self, request: Generate) -> list[Sample]:
        sampling = request.sampling
        prompt = request_prompt(request, self._checkpoint.render_chat, self._vocab, self._positions)
        received = anyio.current_time()
        lengths = sample_lengths(self.workload, sampling.n, self._rng)
        samples: list[Sample | None] = [None] * sampling.n

        async def decode(index: int) -> None:
            self._waiting += 1
            async with self._slots:
                self._waiting -= 1
                self._running += 1
                started = anyio.current_time()
                await anyio.sleep(int(lengths[index]) / self.workload.decode_tokens_per_s)
                self._running -= 1
            samples[index] = self._sample(index, prompt, int(lengths[index]), started, received)

        async with anyio.create_task_group() as tasks:
            for index in range(sampling.n):
                tasks.start_soon(decode, index)
        return [s for s in samples if s is not None]

    def _sample(
        self, index: int, prompt: list[int], length: int, started: float, received: float
    ) -> Sample:
        """A finished sample: each token stamped with the version that was live when the
        simulated decoder produced it."""
        rate = self.workload.decode_tokens_per_s
        produced = started + (np.arange(length) + 1) / rate
        versions = np.searchsorted(self._updates, produced, side="right").astype(np.int32)
        right = self._rng.random() < self.workload.correct
        verdict = "Correct" if self._rng.random() < self.workload.correct else "Wrong"
        text = f"Checked each step. \\boxed{{{1 if right else 2}}}\n{verdict}"
        self._tokens += length
        finished = anyio.current_time()
        return Sample(
            index=index,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            completion_ids=self._rng.integers(0, self._vocab, length, dtype=np.int32),
            logprobs=np.full(length, -math.log(self._vocab), dtype=np.float32),
            versions=versions,
            finish_reason="stop",
            text=text,
            timings=SampleTimings(started - received, started - received, finished - received),
        )

    async def update_weights(self, version: int, named: list[tuple[str, torch.Tensor]]) -> float:
        """Check the tensors, stand still for ``update_pause_s``; samples running go on
        and their later tokens carry the new version."""
        check_weights(named, self.shapes, self.policy)
        started = anyio.current_time()
        await anyio.sleep(self.workload.update_pause_s)
        self._updates.extend([anyio.current_time()] * (version - self.version))
        self.version = version
        self._last_pause = anyio.current_time() - started
        return self._last_pause

    def statistics(self) -> EngineStats:
        return EngineStats(
            policy=self.policy,
            engine=self.kind,
            version=self.version,
            running=self._running,
            waiting=self._waiting,
            generated_tokens=self._tokens,
            decode_steps=0,
            updates=len(self._updates),
            last_pause_s=self._last_pause,
        )


class SimulatedTrainer(Trainer):
    """The real trainer's admission and batching; a step is a sleep of ``step_s``."""

    def __init__(self, model: Any, config: LearnerConfig, *, step_s: float) -> None:
        super().__init__(model, config)
        self.step_s = step_s

    def train(self, batch: list[ScoredSegment]) -> dict[str, float]:
        time.sleep(self.step_s)
        segments: list[Segment] = [s.segment for s in batch]
        self.consume(segments, stepped=True)
        self.last_metrics = {"reward_mean": float(np.mean([s.reward for s in batch]))}
        return self.last_metrics


class SimulatedLearner(LearnerActor):
    def __init__(self, model: Any, config: LearnerConfig, *, step_s: float) -> None:
        super().__init__(model, config)
        self.trainer = SimulatedTrainer(model, config, step_s=step_s)


def synthetic_problems(prefix: str = "p") -> Any:
    """Problems for the simulated team, for ever: every answer is 1, so a simulated
    sample is right when it answers 1."""
    index = 0
    while True:
        yield Problem(f"{prefix}{index}", f"Problem {index}: what is 0 + 1?", "1")
        index += 1
