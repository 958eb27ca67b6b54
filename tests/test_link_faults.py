"""Link trouble between two nodes over real TCP: each node reaches the other only
through a fault-injecting proxy (``tests/fault_proxy.py``) that stalls, resets and
partitions the link while messages flow. Every message sent must be handled once, none
lost and none twice, and calls must work again once the link heals."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from runtime import Actor, Message, Node, NodeConfig, PeerUnavailable, Request, open_node
from tests.fault_proxy import FaultProxy

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

CONFIG = NodeConfig(heartbeat_interval=0.1, heartbeat_timeout=1.0, resend_interval=0.2)
SENT = 3000


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


class Numbered(Message, frozen=True):
    n: int


class Handled(Message, frozen=True):
    numbers: list[int]


class Report(Request[Handled], frozen=True):
    pass


class Ledger(Actor):
    """Records every number it handles, duplicates included."""

    inbox = Numbered | Report
    mailbox_size = 64

    def __init__(self) -> None:
        self.numbers: list[int] = []

    async def handle(self, message: Numbered | Report) -> Handled | None:
        if isinstance(message, Report):
            return Handled(list(self.numbers))
        self.numbers.append(message.n)
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def proxied_pair() -> AsyncIterator[tuple[FaultProxy, FaultProxy, Ledger, Node]]:
    """A head and a worker node that see each other only through one proxy each; yields
    the proxies, the worker's ledger actor and the head's node."""
    head_port, worker_port = free_port(), free_port()
    to_head = FaultProxy(("127.0.0.1", head_port))
    to_worker = FaultProxy(("127.0.0.1", worker_port))
    async with anyio.create_task_group() as tasks:
        via_head = await tasks.start(to_head.serve)
        via_worker = await tasks.start(to_worker.serve)
        async with (
            open_node(
                "head",
                listen=f"tcp://127.0.0.1:{head_port}",
                advertise=f"tcp://127.0.0.1:{via_head}",
                config=CONFIG,
            ) as head,
            open_node(
                "worker",
                listen=f"tcp://127.0.0.1:{worker_port}",
                head=f"tcp://127.0.0.1:{via_head}",
                advertise=f"tcp://127.0.0.1:{via_worker}",
                config=CONFIG,
            ) as worker,
        ):
            ledger = Ledger()
            await worker.spawn("ledger", lambda: ledger)
            yield to_head, to_worker, ledger, head
        tasks.cancel_scope.cancel()


async def test_no_message_is_lost_or_handled_twice_across_stalls_resets_and_a_partition() -> None:
    async with proxied_pair() as (to_head, to_worker, ledger, head):
        ref = await head.lookup("ledger")  # the head dials the worker's proxy
        handled_at: dict[str, int] = {}

        async def trouble() -> None:
            await anyio.sleep(0.3)
            for proxy in (to_head, to_worker):
                proxy.stall()
            await anyio.sleep(0.6)  # shorter than the heartbeat timeout
            for proxy in (to_head, to_worker):
                proxy.resume()
            handled_at["stall"] = len(ledger.numbers)
            await anyio.sleep(0.3)
            for proxy in (to_head, to_worker):
                proxy.reset()
            handled_at["reset"] = len(ledger.numbers)
            await anyio.sleep(0.3)
            for proxy in (to_head, to_worker):
                proxy.partition()
            handled_at["partition"] = len(ledger.numbers)
            with pytest.raises(PeerUnavailable):
                await head.call(ref, Report())  # the worker is declared down
            await anyio.sleep(0.5)
            for proxy in (to_head, to_worker):
                proxy.heal()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(trouble)
                for n in range(SENT):
                    await head.send(ref, Numbered(n))
                    await anyio.sleep(0.001)
            await head.wait_acknowledged()
            handled = (await head.call(ref, Report())).numbers

    assert sorted(handled) == list(range(SENT))  # every one handled, none twice
    assert 0 < handled_at["stall"] < handled_at["reset"] < handled_at["partition"] < SENT
    for proxy in (to_head, to_worker):
        assert proxy.counts["resets"] == 1
        assert proxy.counts["partitions"] == 1
    assert to_worker.counts["connections"] >= 3  # ZeroMQ reconnected after each cut
