"""Messages and actors the runtime tests share (also imported by node subprocesses)."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np

from runtime import Actor, Blob, Delivery, Message, Request, current_delivery


class Add(Message, frozen=True):
    n: int


class Count(Message, frozen=True):
    value: int


class Get(Request[Count], frozen=True):
    pass


class Fail(Request[Count], frozen=True):
    why: str


class Hang(Request[Count], frozen=True):
    pass


class Echoed(Message, frozen=True):
    array: np.ndarray
    blob: Blob
    text: str


class Echo(Request[Echoed], frozen=True):
    array: np.ndarray
    blob: Blob
    text: str = ""


class Unexpected(Request[Count], frozen=True):
    """A request no sample actor accepts."""


class Counter(Actor):
    inbox = Add | Get | Fail | Hang
    mailbox_size = 16

    def __init__(self) -> None:
        self.total = 0
        self.gate = anyio.Event()

    async def handle(self, message: Add | Get | Fail | Hang) -> Count | None:
        match message:
            case Add(n=n):
                self.total += n
            case Get():
                return Count(self.total)
            case Fail(why=why):
                raise ValueError(why)
            case Hang():
                await self.gate.wait()
                return Count(-1)
        return None


class Mirror(Actor):
    inbox = Echo

    async def handle(self, message: Echo) -> Echoed:
        return Echoed(message.array, message.blob, message.text)


class Record(Message, frozen=True):
    """One message of a stream: ``key`` is unique across the stream."""

    key: int
    padding: bytes = b""


class Journal(Actor):
    """Appends each record's key and delivery id to a file, one line per handled
    message, and recovers the delivery ids from it after a restart: the effect and
    its de-duplication record are one atomic append."""

    inbox = Record
    mailbox_size = 32

    def __init__(self, path: Path, delay: float = 0.0) -> None:
        self.path = path
        self.delay = delay
        self.file = path.open("a", buffering=1)

    def recovered_deliveries(self) -> list[Delivery]:
        deliveries = []
        for line in self.path.read_text().splitlines():
            _, node, incarnation, seq = line.split()
            deliveries.append(Delivery(node, int(incarnation), int(seq)))
        return deliveries

    async def handle(self, message: Record) -> None:
        if self.delay:
            await anyio.sleep(self.delay)
        delivery = current_delivery.get()
        assert delivery is not None
        self.file.write(f"{message.key} {delivery.node} {delivery.incarnation} {delivery.seq}\n")
