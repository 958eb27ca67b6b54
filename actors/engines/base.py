"""What every generation engine shares: the core interface, request validation, and
the engine actor that puts a core on the runtime.

A core (``TorchEngine``, ``VllmEngine``) owns a model and a generation loop and is run
by an ``open_*`` context manager; ``EngineActor`` is the thin adapter that answers
``Generate`` calls concurrently, assembles ``WeightBucket``s (or receives a broadcast
through a learner's weight group, see ``weight_group``) into a version and hands it to
the core. The core outlives restarts of its actor; a weight group does not (the learner
forms a new one when a broadcast fails).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import anyio.to_thread
import msgspec
import numpy as np
import torch

from actors.engines.weight_group import GroupAddress, WeightGroup, check_specs
from actors.engines.weights import from_bucket
from actors.messages import (
    BroadcastWeights,
    EngineStats,
    Generate,
    Generation,
    GetEngineStats,
    JoinWeightGroup,
    Sample,
    SamplingParams,
    WeightBucket,
    WeightGroupJoined,
    WeightsApplied,
)
from runtime import Actor


class BadRequest(ValueError):
    """A generation request an engine cannot serve; the message names the field."""


class EngineCore(Protocol):
    kind: str
    policy: str
    version: int
    shapes: dict[str, tuple[int, ...]]
    """The shape of every named tensor a weight update may carry."""

    async def generate(self, request: Generate) -> list[Sample]: ...

    async def update_weights(self, version: int, named: list[tuple[str, torch.Tensor]]) -> float:
        """Apply weights between decode steps without dropping running requests;
        returns the seconds generation was paused."""
        ...

    def statistics(self) -> EngineStats: ...


def check_sampling(sampling: SamplingParams, max_tokens_limit: int) -> None:
    """Raise BadRequest naming the first sampling field out of range."""
    problems = [
        ("n", sampling.n >= 1, "at least 1"),
        ("temperature", sampling.temperature >= 0, "at least 0"),
        ("top_p", 0 < sampling.top_p <= 1, "in (0, 1]"),
        ("top_k", sampling.top_k >= 0, "at least 0 (0 switches it off)"),
        ("max_tokens", 1 <= sampling.max_tokens <= max_tokens_limit, f"in 1..{max_tokens_limit}"),
        ("stop", all(sampling.stop), "non-empty strings"),
    ]
    if sampling.temperature == 0 and sampling.n > 1:
        problems.append(("n", False, "1 when temperature is 0 (greedy samples are all alike)"))
    for field, ok, expected in problems:
        if not ok:
            raise BadRequest(
                f"Generate.sampling.{field} must be {expected}, got {getattr(sampling, field)!r}"
            )


def check_prompt(prompt: list[int], vocab_size: int, max_positions: int, max_tokens: int) -> None:
    if not prompt:
        raise BadRequest("Generate has an empty prompt (give prompt_ids or chat)")
    low, high = min(prompt), max(prompt)
    if low < 0 or high >= vocab_size:
        raise BadRequest(
            f"Generate.prompt_ids holds token id {low if low < 0 else high}, outside the "
            f"vocabulary 0..{vocab_size - 1}"
        )
    if len(prompt) + max_tokens > max_positions:
        raise BadRequest(
            f"Generate: prompt of {len(prompt)} tokens + max_tokens {max_tokens} exceeds the "
            f"model's {max_positions} positions"
        )


def check_weights(
    named: list[tuple[str, torch.Tensor]], shapes: dict[str, tuple[int, ...]], policy: str
) -> None:
    """Raise ValueError naming the first tensor the model has no place for, before any
    weight is touched: an update is applied whole or not at all."""
    for name, tensor in named:
        expected = shapes.get(name)
        if expected is None:
            raise ValueError(f"weight {name!r} is not a parameter of the {policy!r} model")
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"weight {name!r} has shape {list(tensor.shape)}, the model's is {list(expected)}"
            )


def request_prompt(
    request: Generate,
    render_chat: Callable[[list[dict[str, str]]], list[int]],
    vocab_size: int,
    max_positions: int,
) -> list[int]:
    """The prompt token ids of a request, checked with its sampling parameters; raises
    BadRequest naming the field at fault."""
    check_sampling(request.sampling, max_positions)
    prompt = prompt_array(request.prompt_ids)
    if request.chat:
        if prompt:
            raise BadRequest("Generate: give prompt_ids or chat, not both")
        prompt = render_chat([{"role": t.role, "content": t.content} for t in request.chat])
    check_prompt(prompt, vocab_size, max_positions, request.sampling.max_tokens)
    return prompt


def prompt_array(prompt_ids: np.ndarray | None) -> list[int]:
    if prompt_ids is None:
        return []
    if prompt_ids.ndim != 1 or prompt_ids.dtype.kind not in "iu":
        raise BadRequest(
            f"Generate.prompt_ids must be a 1-D integer array, got {prompt_ids.dtype} "
            f"of shape {prompt_ids.shape}"
        )
    return [int(t) for t in prompt_ids]


class Occupancy:
    """How busy an engine is, whatever its core: the seconds during which at least one
    request ran, and the samples requested integrated over the time their request ran
    (a sample counts until its whole request returns). Benchmarks read generation idle
    time and occupancy from these."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.sequence_s = 0.0
        self._requests = 0
        self._samples = 0
        self._since = time.monotonic()

    def begin(self, samples: int) -> None:
        self._advance()
        self._requests += 1
        self._samples += samples

    def end(self, samples: int) -> None:
        self._advance()
        self._requests -= 1
        self._samples -= samples

    def _advance(self) -> None:
        now = time.monotonic()
        elapsed, self._since = now - self._since, now
        if self._requests:
            self.busy_s += elapsed
        self.sequence_s += self._samples * elapsed

    def stamp(self, stats: EngineStats) -> EngineStats:
        self._advance()
        return msgspec.structs.replace(stats, busy_s=self.busy_s, sequence_s=self.sequence_s)


class EngineActor(Actor):
    """Serves one engine core under a name such as ``engine/solver/0``."""

    inbox = Generate | WeightBucket | JoinWeightGroup | BroadcastWeights | GetEngineStats
    mailbox_size = 1024
    concurrency = 1024

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._buckets: dict[int, dict[int, WeightBucket]] = {}
        self._group: WeightGroup | None = None
        self.occupancy = Occupancy()

    async def on_stop(self) -> None:
        if self._group is not None:
            self._group.close()

    async def handle(
        self, message: Generate | WeightBucket | JoinWeightGroup | BroadcastWeights | GetEngineStats
    ) -> Generation | WeightsApplied | WeightGroupJoined | EngineStats:
        if isinstance(message, Generate):
            self.occupancy.begin(message.sampling.n)
            try:
                samples = await self.core.generate(message)
            finally:
                self.occupancy.end(message.sampling.n)
            return Generation(message.request_id, self.core.policy, samples)
        if isinstance(message, WeightBucket):
            return await self._on_bucket(message)
        if isinstance(message, JoinWeightGroup):
            return await self._join(message)
        if isinstance(message, BroadcastWeights):
            return await self._on_broadcast(message)
        return self.occupancy.stamp(self.core.statistics())

    def _check_update(self, kind: str, policy: str, version: int) -> None:
        if policy != self.core.policy:
            raise ValueError(
                f"{kind}.policy is {policy!r}; this engine serves {self.core.policy!r}"
            )
        if version <= self.core.version:
            raise ValueError(
                f"{kind}.version {version} is not newer than the engine's "
                f"version {self.core.version}"
            )

    async def _on_bucket(self, bucket: WeightBucket) -> WeightsApplied:
        self._check_update("WeightBucket", bucket.policy, bucket.version)
        if not 0 <= bucket.index < bucket.count:
            raise ValueError(f"WeightBucket.index {bucket.index} is outside 0..{bucket.count - 1}")
        list(from_bucket(bucket))  # validate now, so a bad bucket fails its own call
        held = self._buckets.setdefault(bucket.version, {})
        held[bucket.index] = bucket
        if len(held) < bucket.count:
            return WeightsApplied(bucket.policy, bucket.version, applied=False)
        del self._buckets[bucket.version]
        for older in [v for v in self._buckets if v < bucket.version]:
            del self._buckets[older]  # superseded before it was complete
        named = [pair for index in sorted(held) for pair in from_bucket(held[index])]
        pause = await self.core.update_weights(bucket.version, named)
        return WeightsApplied(bucket.policy, bucket.version, applied=True, pause_s=pause)

    async def _join(self, message: JoinWeightGroup) -> WeightGroupJoined:
        if message.policy != self.core.policy:
            raise ValueError(
                f"JoinWeightGroup.policy is {message.policy!r}; this engine serves "
                f"{self.core.policy!r}"
            )
        if self._group is not None:
            self._group.close()
            self._group = None
        address = GroupAddress(
            message.host,
            message.port,
            message.group,
            message.world_size,
            message.backend,
            message.timeout_s,
        )
        self._group = await anyio.to_thread.run_sync(WeightGroup, address, message.rank)
        return WeightGroupJoined(message.policy, message.group, message.rank)

    async def _on_broadcast(self, message: BroadcastWeights) -> WeightsApplied:
        self._check_update("BroadcastWeights", message.policy, message.version)
        group = self._group
        if group is None or group.address.name != message.group:
            raise ValueError(f"BroadcastWeights.group {message.group!r} was not joined")
        check_specs(message.tensors, self.core.shapes, message.policy)
        try:
            named = await anyio.to_thread.run_sync(
                group.receive, message.tensors, message.bucket_bytes, abandon_on_cancel=True
            )
        except BaseException:
            group.close()
            if self._group is group:
                self._group = None
            raise
        pause = await self.core.update_weights(message.version, named)
        return WeightsApplied(message.policy, message.version, applied=True, pause_s=pause)
