"""A learner process killed with SIGKILL in the middle of a stream and started again
ends where an uninterrupted learner ends: the same version and the same weights, every
segment trained on once (none lost with the process, none trained twice)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
import torch
from anyio.abc import Process
from safetensors.torch import load_file

from actors.messages import GetLearnerStats, ScoredSegment
from actors.models import load_checkpoint
from learner.checkpoints import latest_checkpoint
from learner.segment_log import encode_record
from learner.trainer import LearnerConfig, Trainer
from runtime import Codec, Node, NodeConfig, open_node
from tests.learner.segments import scored

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

GROUPS = 32


def stream() -> list[ScoredSegment]:
    """Groups of two, the second member of each after the first of the next: a partial
    group is always held, so checkpoints and the log both carry held segments."""
    first = [scored(f"{g}-0", group=f"g{g}", reward=1.0) for g in range(GROUPS)]
    second = [scored(f"{g}-1", group=f"g{g}", reward=0.0) for g in range(GROUPS)]
    order = [first[0]]
    for g in range(GROUPS):
        order += [first[g + 1]] if g + 1 < GROUPS else []
        order.append(second[g])
    return order


def trained_without_a_kill(
    tiny_path: Path, config: LearnerConfig, segments: list[ScoredSegment]
) -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(load_checkpoint(tiny_path).model, config)
        for segment in segments:
            batch = trainer.admit(segment)
            if batch is not None:
                trainer.train(batch)
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def read_checkpoint_step(root: Path) -> int:
    latest = latest_checkpoint(root)
    return int(latest.name.removeprefix("step-")) if latest else 0


async def start_learner(head: Node, tiny_path: Path, config: LearnerConfig, listen: str) -> Process:
    command = [sys.executable, "-m", "learner.serve", "--head", head.address, "--listen", listen]
    command += ["--model", str(tiny_path), "--config", msgspec.json.encode(config).decode()]
    command += ["--log-level", "warning"]
    process = await anyio.open_process(command, stderr=None)
    assert process.stdout is not None
    line = b""
    with anyio.fail_after(120):
        while not line.endswith(b"\n"):
            line += await process.stdout.receive()
    assert json.loads(line)["name"] == "learner/p", line
    return process


async def test_a_killed_learner_resumes_with_nothing_lost_or_trained_twice(
    tiny_path: Path, tmp_path: Path
) -> None:
    config = LearnerConfig(
        policy="p",
        lr=1e-3,
        groups_per_batch=1,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_every=4,
        max_staleness=GROUPS,
    )
    segments = stream()
    checkpoints = Path(config.checkpoint_dir)
    record = len(encode_record(Codec(), segments[0]))
    listen = f"ipc://{tmp_path}/learner.sock"
    fast = NodeConfig(heartbeat_interval=0.2, heartbeat_timeout=2.0, resend_interval=0.5)
    async with open_node("head", config=fast) as head:
        learner = await start_learner(head, tiny_path, config, listen)
        try:
            ref = await head.lookup("learner/p", timeout=60)
            with anyio.fail_after(180):
                async with anyio.create_task_group() as tasks:

                    async def produce() -> None:
                        for segment in segments:
                            await head.send(ref, segment)

                    tasks.start_soon(produce)
                    # The learner's mailbox is FIFO, so asking it how far it got would
                    # wait for the stream: watch its files. Kill a few segments after a
                    # checkpoint, with steps trained and a group held since.
                    log = checkpoints / "segments.log"
                    while latest_checkpoint(checkpoints) is None or size(log) < 5 * record:  # noqa: ASYNC110
                        await anyio.sleep(0.002)
                    os.kill(learner.pid, signal.SIGKILL)
                    await learner.wait()
                    killed_at = read_checkpoint_step(checkpoints), size(log) // record
                    learner = await start_learner(head, tiny_path, config, listen)
                await head.wait_acknowledged()
                stats = await head.call(ref, GetLearnerStats(), timeout=30)
            resent = head.link_statistics("learner/p").resent
        finally:
            if learner.returncode is None:
                learner.kill()
            await learner.wait()
    assert killed_at[0] < GROUPS - 4, f"the kill did not land mid-stream: {killed_at}"
    assert resent > 0, "nothing was redelivered, so the restart proved nothing"
    assert (stats.version, stats.held_segments) == (GROUPS, 0)
    final = latest_checkpoint(config.checkpoint_dir)
    assert final is not None and final.name.endswith(f"{GROUPS:09d}")
    meta = json.loads((final / "meta.json").read_text())
    assert sorted(meta["consumed"]) == sorted(s.segment.segment_id for s in segments)
    weights = load_file(final / "model.safetensors")
    reference = trained_without_a_kill(tiny_path, config, segments)
    one_short = trained_without_a_kill(tiny_path, config, segments[:-1])
    close = {name: torch.allclose(weights[name], reference[name], atol=1e-6) for name in weights}
    assert all(close.values()), [name for name, ok in close.items() if not ok]
    # A lost or repeated step would show: one step fewer moves the weights far beyond atol.
    assert not all(torch.allclose(weights[n], one_short[n], atol=1e-6) for n in weights)
