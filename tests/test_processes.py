"""Across real processes: backpressure keeps both sides bounded, a receiving node
killed with SIGKILL mid-stream and restarted still handles every message exactly once,
and a hung one (SIGSTOP) is declared down by heartbeats like a dead one."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from runtime import ActorRef, Node, PeerUnavailable, open_node
from tests.node_process import Probe, config, rss_bytes
from tests.sample_actors import Record

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

NODE = Path(__file__).with_name("node_process.py")


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def start_consumer(head: Node, listen: str, journal: Path, delay: float) -> Process:
    args = ["--head", head.address, "--listen", listen, "--journal", str(journal)]
    process = await anyio.open_process(
        [sys.executable, str(NODE), *args, "--delay", str(delay)], stderr=None
    )
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        line += await process.stdout.receive()
    assert json.loads(line)["ready"], line
    return process


async def stop(process: Process) -> None:
    if process.returncode is None:
        process.kill()
    with anyio.fail_after(30):
        await process.wait()


async def test_fast_producer_slows_to_a_slow_consumer_with_bounded_memory(tmp_path: Path) -> None:
    async with open_node("producer", config=config()) as node:
        consumer = await start_consumer(node, "tcp://127.0.0.1:*", tmp_path / "journal", 0.002)
        try:
            journal = await node.lookup("journal", timeout=30)
            probe = await node.lookup("probe", timeout=30)
            padding = bytes(64 * 1024)  # an unbounded queue would grow by GBs in seconds
            sent, producer_rss, consumer_rss, unacked, queued = 0, [], [], [], []

            async def watch() -> None:
                while True:
                    probed = await node.call(probe, Probe(), timeout=10)
                    consumer_rss.append(probed.rss_bytes)
                    queued.append(probed.mailbox + probed.in_flight)
                    producer_rss.append(rss_bytes())
                    unacked.append(node.link_statistics("consumer").unacked)
                    await anyio.sleep(0.25)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch)
                with anyio.move_on_after(4.0):
                    while True:
                        await node.send(journal, Record(sent, padding))
                        sent += 1
                tasks.cancel_scope.cancel()
            handled = (await node.call(probe, Probe(), timeout=10)).handled
        finally:
            await stop(consumer)
    capacity = 32  # Journal.mailbox_size
    assert handled > 200, "the consumer barely ran; the figures below would mean nothing"
    assert sent - handled <= 2 * capacity, f"producer ran ahead: sent {sent}, handled {handled}"
    assert max(queued) <= capacity
    assert max(unacked) <= capacity + 1
    mib = 1 << 20
    assert max(producer_rss) - producer_rss[0] < 64 * mib
    assert max(consumer_rss) - consumer_rss[0] < 64 * mib


async def test_killed_receiver_handles_every_accepted_message_exactly_once(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.touch()
    listen = f"ipc://{tmp_path}/consumer.sock"
    total = 3000
    async with open_node("producer", config=config()) as node:
        consumer = await start_consumer(node, listen, journal, 0.0005)
        try:
            target: ActorRef = await node.lookup("journal", timeout=30)
            done = anyio.Event()

            async def produce() -> None:
                for key in range(total):
                    await node.send(target, Record(key))
                done.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(produce)
                # Another process writes the journal: there is nothing to wait on but the file.
                while len(journal.read_text().splitlines()) < total // 3:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                os.kill(consumer.pid, signal.SIGKILL)
                await consumer.wait()
                killed_after = len(journal.read_text().splitlines())
                consumer = await start_consumer(node, listen, journal, 0.0005)
                with anyio.fail_after(120):
                    await done.wait()
                    await node.wait_acknowledged()
            link = node.link_statistics("consumer")
        finally:
            await stop(consumer)
    keys = [int(line.split()[0]) for line in journal.read_text().splitlines()]
    assert total // 3 <= killed_after < total, "the kill did not land mid-stream"
    assert link.resent > 0, "nothing was redelivered, so the restart proved nothing"
    assert sorted(keys) == list(range(total)), (
        f"{len(keys)} handled, {len(set(keys))} distinct, missing "
        f"{sorted(set(range(total)) - set(keys))[:10]}"
    )


async def test_a_hung_receiver_is_declared_down_within_the_heartbeat_timeout(
    tmp_path: Path,
) -> None:
    """SIGSTOP leaves the socket open and the process alive, so only the missing
    heartbeats tell; a call waiting on the hung node fails with PeerUnavailable then,
    long before its own timeout."""
    timeout = config().heartbeat_timeout
    async with open_node("producer", config=config()) as node:
        consumer = await start_consumer(node, "tcp://127.0.0.1:*", tmp_path / "journal", 0.0)
        try:
            probe = await node.lookup("probe", timeout=30)
            await node.call(probe, Probe(), timeout=10)
            assert node.peer_is_up("consumer")
            os.kill(consumer.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            with pytest.raises(PeerUnavailable):
                await node.call(probe, Probe(), timeout=10 * timeout)
            detected = time.monotonic() - stopped
            assert not node.peer_is_up("consumer")
        finally:
            os.kill(consumer.pid, signal.SIGCONT)
            await stop(consumer)
    assert timeout / 2 <= detected <= timeout + 1.0, f"declared down after {detected:.2f} s"
