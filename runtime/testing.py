"""Helpers for testing actors without sockets.

``open_cluster`` runs a head and workers on a private ``MemoryNetwork`` inside the
test's event loop, so a test uses the real runtime (links, credit, acknowledgements,
heartbeats) and still runs under pytest-trio's ``autojump_clock``: a 5-second heartbeat
timeout passes in no wall-clock time. ``Capture`` is an actor that records what it
receives, for asserting on what an actor under test sent::

    async with open_cluster("head", "worker") as (head, worker):
        capture = Capture(Reply)
        sink = await head.spawn("sink", capture.factory)
        await worker.send(sink, Reply(1))
        assert await capture.wait_for(1) == [Reply(1)]
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio

from ._actor import Actor
from ._config import NodeConfig
from ._memory import MemoryNetwork
from ._node import Node, open_node

__all__ = ["Capture", "MemoryNetwork", "open_cluster"]


class Capture:
    """Records every message its actor handles, in order of handling."""

    def __init__(
        self,
        inbox: Any,
        *,
        mailbox_size: int = 1024,
        answer: Callable[[Any], Any] | None = None,
    ) -> None:
        """``answer`` replies to each message it returns a value for, and those are not
        recorded: a stand-in for an actor that other actors ask questions of."""
        self.messages: list[Any] = []
        self._changed = anyio.Event()
        capture = self

        class CaptureActor(Actor):
            async def handle(self, message: Any) -> Any:
                if answer is not None and (reply := answer(message)) is not None:
                    return reply
                capture.messages.append(message)
                capture._changed.set()
                capture._changed = anyio.Event()

        CaptureActor.inbox = inbox
        CaptureActor.mailbox_size = mailbox_size
        self._actor_type = CaptureActor

    @property
    def factory(self) -> Callable[[], Actor]:
        return self._actor_type

    async def wait_for(self, count: int) -> list[Any]:
        """Wait until at least ``count`` messages arrived; returns all of them."""
        while len(self.messages) < count:
            await self._changed.wait()
        return list(self.messages)


@asynccontextmanager
async def open_cluster(
    *names: str, config: NodeConfig | None = None, network: MemoryNetwork | None = None
) -> AsyncIterator[list[Node]]:
    """Open one node per name on a memory network; the first is the head."""
    if not names:
        raise ValueError("open_cluster needs at least one node name")
    network = network or MemoryNetwork()
    async with AsyncExitStack() as stack:
        head = await stack.enter_async_context(
            open_node(names[0], listen=f"mem://{names[0]}", config=config, transport=network)
        )
        nodes = [head]
        for name in names[1:]:
            nodes.append(
                await stack.enter_async_context(
                    open_node(
                        name,
                        listen=f"mem://{name}",
                        head=head.address,
                        config=config,
                        transport=network,
                    )
                )
            )
        yield nodes
