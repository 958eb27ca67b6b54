"""Checkpoints restore everything a resumed run needs, and are complete or absent."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.messages import FlushBatch
from learner import checkpoints
from learner.checkpoints import (
    complete_checkpoints,
    latest_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from learner.segment_log import SegmentLog, read_segments
from tests.learner.segments import encoded, scored


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def test_a_checkpoint_restores_weights_optimizer_randomness_and_progress(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    held = [scored("s3", group="h"), scored("s4", group="i")]
    path = write_checkpoint(
        tmp_path,
        model=model,
        optimizer=optimizer,
        version=7,
        step=3,
        consumed={"s1", "s2"},
        held=held,
    )
    expected = (torch.rand(3), random.random(), np.random.rand())

    other, other_optimizer = trained(1)
    torch.rand(10), random.random(), np.random.rand()  # move every generator on
    state = read_checkpoint(path, model=other, optimizer=other_optimizer)

    assert (state.version, state.step, state.consumed) == (7, 3, frozenset({"s1", "s2"}))
    assert encoded(state.held) == encoded(held)
    for mine, theirs in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    moments = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(other_optimizer.state_dict()["state"][0]["exp_avg"], moments)
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_a_crash_while_writing_leaves_no_checkpoint_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = trained(0)
    write_checkpoint(tmp_path, model=model, optimizer=optimizer, version=1, step=1, consumed=[])

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints.os, "rename", crash)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path, model=model, optimizer=optimizer, version=2, step=2, consumed=[])
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001"]


def test_a_half_written_directory_is_ignored_and_old_ones_are_pruned(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    for step in range(1, 5):
        write_checkpoint(
            tmp_path, model=model, optimizer=optimizer, version=step, step=step, consumed=[], keep=2
        )
    (tmp_path / ".step-000000005.dead.tmp").mkdir()
    (tmp_path / "step-000000006").mkdir()  # no meta.json: never completed
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000000003", "step-000000004"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000000004"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_the_segment_log_ends_at_a_record_cut_short_or_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "segments.log"
    log = SegmentLog(path)
    written = [scored(f"s{i}", reward=float(i)) for i in range(3)]
    for segment in written:
        log.append(segment)
    assert encoded(read_segments(path)) == encoded(written)
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # killed in the middle of the last write
    assert encoded(read_segments(path)) == encoded(written[:2])
    corrupted = bytearray(whole)
    corrupted[len(whole) // 2] ^= 0xFF
    path.write_bytes(bytes(corrupted))
    assert encoded(read_segments(path)) == encoded(written[:1])
    log.restart()
    log.append(written[2])
    log.close()
    assert encoded(read_segments(path)) == encoded(written[2:])


def test_the_segment_log_keeps_flushes_in_their_place(tmp_path: Path) -> None:
    path = tmp_path / "segments.log"
    log = SegmentLog(path)
    log.append(scored("s0"))
    log.append(FlushBatch("p"))
    log.append(scored("s1"))
    log.close()
    records = read_segments(path)
    assert [type(r).__name__ for r in records] == ["ScoredSegment", "FlushBatch", "ScoredSegment"]
    assert records[1] == FlushBatch("p")
