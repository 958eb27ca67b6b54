"""Scored segments for the learner tests, with every field a test does not name set
to something valid."""

from __future__ import annotations

import numpy as np

from actors.messages import ScoredSegment, Segment
from runtime import Codec

PROMPT = np.array([257, 265, 198, 16, 258, 198, 257, 266, 198], dtype=np.int32)


def scored(
    segment_id: str,
    *,
    group: str = "g",
    group_size: int = 2,
    role: str = "solver",
    policy: str = "p",
    reward: float = 1.0,
    completion: list[int] | None = None,
    logprobs: list[float] | None = None,
    versions: list[int] | None = None,
) -> ScoredSegment:
    completion = completion or [16, 17, 258]
    segment = Segment(
        segment_id=segment_id,
        episode_id="e",
        sample_id=segment_id,
        parent_id="",
        group=group,
        group_size=group_size,
        role=role,
        policy=policy,
        prompt_ids=PROMPT,
        completion_ids=np.array(completion, dtype=np.int32),
        logprobs=np.array(logprobs or [-1.0] * len(completion), dtype=np.float32),
        versions=np.array(versions or [0] * len(completion), dtype=np.int32),
        finish_reason="stop",
    )
    return ScoredSegment(segment, reward)


def encoded(segments: list[ScoredSegment]) -> list[tuple[bytes, list[bytes]]]:
    """Segments as comparable values (their arrays make ``==`` ambiguous)."""
    codec = Codec()
    out = []
    for segment in segments:
        payload, frames = codec.encode(segment)
        out.append((payload, [bytes(f) for f in frames]))
    return out
