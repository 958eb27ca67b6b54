"""Batches form from a stream: whole GRPO groups, REINFORCE++ counts, bounded buffers,
and micro-batches within a token budget."""

from __future__ import annotations

import pytest

from learner.batching import BufferFull, CountBuffer, GroupBuffer, micro_batches
from tests.learner.segments import scored


def test_groups_are_released_whole_whatever_order_their_samples_arrive_in() -> None:
    buffer = GroupBuffer(max_segments=10)
    arrivals = [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("a3", "A")]
    released = []
    for segment_id, group in arrivals:
        group_done = buffer.add(
            scored(segment_id, group=group, group_size=3 if group == "A" else 2)
        )
        if group_done:
            released.append([s.segment.segment_id for s in group_done])
    assert released == [["b1", "b2"], ["a1", "a2", "a3"]]
    assert (buffer.held, buffer.partial_groups) == (0, 0)


def test_a_full_group_buffer_refuses_new_groups_but_completes_held_ones() -> None:
    buffer = GroupBuffer(max_segments=2)
    buffer.add(scored("a1", group="A", group_size=2))
    buffer.add(scored("b1", group="B", group_size=2))
    with pytest.raises(BufferFull):
        buffer.add(scored("c1", group="C", group_size=2))
    assert buffer.add(scored("a2", group="A", group_size=2)) is not None
    assert buffer.held == 1


def test_count_buffer_releases_every_size_segments() -> None:
    buffer = CountBuffer(2)
    out = [buffer.add(scored(str(i), group=str(i), group_size=1)) for i in range(5)]
    assert [None if b is None else len(b) for b in out] == [None, 2, None, 2, None]
    assert buffer.held == 1


def test_micro_batches_fit_the_token_budget_and_cover_every_row_once() -> None:
    lengths = [10, 3, 7, 3, 12, 1, 30]
    pieces = micro_batches(lengths, token_budget=24)
    assert sorted(i for piece in pieces for i in piece) == list(range(len(lengths)))
    for piece in pieces:
        longest = max(lengths[i] for i in piece)
        assert longest * len(piece) <= 24 or len(piece) == 1
    assert [6] in pieces  # longer than the budget: alone
