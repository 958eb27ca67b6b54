"""An in-process network for ``mem://`` addresses: same semantics as ZeroMQ, no sockets.

Batches are queued per endpoint (bounded: a full queue is ``WouldBlock``, as at a
high-water mark) and delivered by the receiving endpoint's own task, so a node never
runs another node's code inside its own call stack. Frames are passed by reference,
not copied. Closing an endpoint drops whatever it had not yet delivered, exactly as a
crashed process would; dialers then see ``WouldBlock`` until something listens at the
address again. Runs on any anyio backend and under trio's ``autojump_clock``.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel

from ._transport import Buffer, Connection, Endpoint, OnFrames, Transport


class MemoryNetwork(Transport):
    """A private network; nodes opened with it reach each other by ``mem://name``."""

    def __init__(self, *, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._listeners: dict[str, _MemoryEndpoint] = {}
        self._changed = anyio.Event()

    @asynccontextmanager
    async def open(self, identity: str, on_frames: OnFrames) -> AsyncIterator[Endpoint]:
        endpoint = _MemoryEndpoint(self, identity, on_frames)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(endpoint.deliver)
                try:
                    yield endpoint
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            endpoint.closed = True
            for address in endpoint.addresses:
                if self._listeners.get(address) is endpoint:
                    del self._listeners[address]
            self.notify()

    def notify(self) -> None:
        """Wake everyone waiting for a queue to drain or an address to appear."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def listener(self, address: str) -> _MemoryEndpoint | None:
        return self._listeners.get(address)

    def bind(self, address: str, endpoint: _MemoryEndpoint) -> None:
        if not address.startswith("mem://") or len(address) <= len("mem://"):
            raise OSError(errno.EINVAL, f"memory addresses look like mem://name, not {address!r}")
        if address in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{address} is already listening")
        self._listeners[address] = endpoint
        self.notify()


class _MemoryEndpoint(Endpoint):
    def __init__(self, network: MemoryNetwork, identity: str, on_frames: OnFrames) -> None:
        self.network = network
        self.identity = identity
        self.on_frames = on_frames
        self.addresses: list[str] = []
        self.closed = False
        self._queue: deque[tuple[Connection, list[Buffer]]] = deque()
        self._arrived = anyio.Event()

    async def listen(self, address: str) -> str:
        await anyio.lowlevel.checkpoint()
        self.network.bind(address, self)
        self.addresses.append(address)
        return address

    def dial(self, address: str) -> Connection:
        return _MemoryDealer(self, address)

    def push(self, route: Connection, frames: list[Buffer]) -> None:
        if self.closed:
            raise anyio.BrokenResourceError(f"{self.identity} is closed")
        if len(self._queue) >= self.network.capacity:
            raise anyio.WouldBlock
        self._queue.append((route, frames))
        self._arrived.set()

    async def deliver(self) -> None:
        while True:
            if not self._queue:
                self._arrived = anyio.Event()
                await self._arrived.wait()
            for _ in range(min(len(self._queue), 64)):
                route, frames = self._queue.popleft()
                self.on_frames(route, frames)
            self.network.notify()
            await anyio.lowlevel.checkpoint()


class _MemoryDealer(Connection):
    def __init__(self, endpoint: _MemoryEndpoint, address: str) -> None:
        self.endpoint = endpoint
        self._address = address
        self._back = _MemoryRoute(self)

    def send_nowait(self, frames: list[Buffer]) -> None:
        peer = self.endpoint.network.listener(self._address)
        if peer is None:
            raise anyio.WouldBlock  # like IMMEDIATE: nobody to queue for yet
        peer.push(self._back, frames)

    async def wait_writable(self) -> None:
        await self.endpoint.network.wait_changed()

    def __repr__(self) -> str:
        return f"<memory dealer to {self._address}>"


class _MemoryRoute(Connection):
    """The way back from a listener to the dealer that dialed it; what arrives through
    it is delivered as having come in on that dealer, as with ZeroMQ."""

    def __init__(self, dealer: _MemoryDealer) -> None:
        self._dealer = dealer
        self.identity = dealer.endpoint.identity

    def send_nowait(self, frames: list[Buffer]) -> None:
        self._dealer.endpoint.push(self._dealer, frames)

    async def wait_writable(self) -> None:
        await self._dealer.endpoint.network.wait_changed()

    def __repr__(self) -> str:
        return f"<memory route back to {self._dealer.endpoint.identity}>"
