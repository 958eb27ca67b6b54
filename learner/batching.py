"""Turning a stream of scored segments into training batches.

GRPO needs whole groups (its baseline is the group's mean), so ``GroupBuffer`` holds
each group until its last sample arrives and releases it at once; REINFORCE++ has no
group baseline, so ``CountBuffer`` releases every ``size`` actions. Both are bounded:
a buffer that would exceed its bound refuses the segment (the caller counts and reports
it) rather than growing. ``micro_batches`` then packs a batch into pieces whose padded
size fits a token budget, for gradient accumulation.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.messages import ScoredSegment


class BufferFull(Exception):
    """The buffer is at its bound; the segment was not taken."""


class GroupBuffer:
    """Holds partial GRPO groups; ``add`` returns a group once it is complete."""

    def __init__(self, *, max_segments: int) -> None:
        self.max_segments = max_segments
        self._groups: dict[str, list[ScoredSegment]] = {}
        self._held = 0

    def add(self, scored: ScoredSegment) -> list[ScoredSegment] | None:
        segment = scored.segment
        if segment.group_size < 1:
            raise ValueError(f"segment {segment.segment_id!r}: group_size must be at least 1")
        members = self._groups.get(segment.group)
        if members is None and segment.group_size > 1 and self._held >= self.max_segments:
            raise BufferFull(f"{self._held} segments of partial groups are held already")
        members = self._groups.setdefault(segment.group, [])
        members.append(scored)
        self._held += 1
        if len(members) < segment.group_size:
            return None
        del self._groups[segment.group]
        self._held -= len(members)
        return members

    @property
    def held(self) -> int:
        return self._held

    @property
    def partial_groups(self) -> int:
        return len(self._groups)


class CountBuffer:
    """Releases a batch every ``size`` segments."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"batch size must be at least 1, got {size}")
        self.size = size
        self._pending: list[ScoredSegment] = []

    def add(self, scored: ScoredSegment) -> list[ScoredSegment] | None:
        self._pending.append(scored)
        if len(self._pending) < self.size:
            return None
        batch, self._pending = self._pending, []
        return batch

    def take(self) -> list[ScoredSegment]:
        """Everything pending, however few."""
        batch, self._pending = self._pending, []
        return batch

    @property
    def held(self) -> int:
        return len(self._pending)


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of ``lengths`` in pieces whose padded size (rows * longest row) stays
    within ``token_budget``; a row longer than the budget gets a piece of its own.
    Rows are taken longest first, so similar lengths share a piece and little is
    padding."""
    if token_budget < 1:
        raise ValueError(f"token budget must be at least 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    pieces: list[list[int]] = []
    for index in order:
        piece = pieces[-1] if pieces else None
        if piece and lengths[piece[0]] * (len(piece) + 1) <= token_budget:
            piece.append(index)
        else:
            pieces.append([index])
    return pieces
