"""What a node needs from a network: listen at an address, dial an address, move batches.

A transport moves *batches* (lists of frames) between node endpoints and nothing else:
sequencing, acknowledgement, credit and heartbeats live above it, in the link
protocol, so every transport gets the same guarantees. Implementations: ZeroMQ
(``tcp://``, ``ipc://``) and an in-process memory network (``mem://``); one conformance
suite runs over all of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

Buffer = bytes | memoryview


class Connection(ABC):
    """One way to reach one peer: a dialed socket, or the route back to a peer that
    dialed us. A route back knows the ``identity`` the peer presented when it connected;
    a dialed socket does not (``None``)."""

    identity: str | None = None

    @abstractmethod
    def send_nowait(self, frames: list[Buffer]) -> None:
        """Hand a batch to the transport without waiting.

        Raises ``anyio.WouldBlock`` when the transport cannot take it now (not yet
        connected, or its high-water mark is reached) and ``anyio.BrokenResourceError``
        when this route no longer leads anywhere.
        """

    @abstractmethod
    async def wait_writable(self) -> None:
        """Return once ``send_nowait`` may succeed (callers bound this with a timeout)."""


OnFrames = Callable[[Connection, list[Buffer]], None]


class Endpoint(ABC):
    """A node's sockets. Inbound batches go to the ``OnFrames`` callback it was opened
    with, called from the endpoint's own tasks, one batch at a time."""

    @abstractmethod
    async def listen(self, address: str) -> str:
        """Accept connections at ``address``; returns the address actually bound."""

    @abstractmethod
    def dial(self, address: str) -> Connection:
        """Connect to a peer's listening address; reconnects by itself if the peer
        restarts."""


class Transport(ABC):
    @abstractmethod
    def open(self, identity: str, on_frames: OnFrames) -> AbstractAsyncContextManager[Endpoint]:
        """Open an endpoint that identifies itself to peers as ``identity``."""
