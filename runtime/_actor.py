"""The base class users subclass to write an actor."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgspec

from ._message import ActorRef, Request

if TYPE_CHECKING:
    from ._node import Node
    from ._supervisor import Supervisor

R = TypeVar("R")
A = TypeVar("A", bound="Actor")


class Delivery(msgspec.Struct, frozen=True):
    """The identity of one delivered message, the same on every redelivery: the sending
    node, that node's incarnation and the link's sequence number."""

    node: str
    incarnation: int
    seq: int


current_delivery: ContextVar[Delivery | None] = ContextVar("current_delivery", default=None)


class Actor:
    """An object with a bounded mailbox that handles one message at a time.

    Subclasses declare ``inbox`` (a message class or a union of them); messages of any
    other type are rejected before they reach ``handle``. ``mailbox_size`` bounds the
    messages queued for it (senders wait for credit beyond it); ``concurrency`` is how
    many messages it may handle at once.

    ``handle`` returns the reply for a ``call`` (ignored for ``send``). If it raises
    while handling a call, the caller gets a ``RemoteError`` and the actor carries on.
    If it raises while handling a one-way message, nobody else can be told: the actor
    crashes, its supervisor restarts it, and the message is handed to the new instance
    again (at most ``NodeConfig.max_attempts`` times, then it is dead-lettered).

    An actor that records its effects durably can override ``recovered_deliveries``
    to return the ``Delivery`` ids (from ``current_delivery``) it had recorded; after a
    restart of its node, redeliveries of those are dropped instead of handled again.
    """

    inbox: ClassVar[Any] = None
    mailbox_size: ClassVar[int] = 64
    concurrency: ClassVar[int] = 1

    name: str
    node: Node

    @property
    def ref(self) -> ActorRef:
        return ActorRef(self.node.name, self.name)

    async def on_start(self) -> None:
        """Called before the first message, in every incarnation of the actor."""

    async def handle(self, message: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement handle()")

    async def on_stop(self) -> None:
        """Called when the actor is stopped or crashed; bounded by the node's
        shutdown timeout."""

    def recovered_deliveries(self) -> Iterable[Delivery]:
        return ()

    async def send(self, ref: ActorRef, message: msgspec.Struct) -> None:
        await self.node.send(ref, message, source=self.name)

    def send_nowait(self, ref: ActorRef, message: msgspec.Struct) -> None:
        self.node.send_nowait(ref, message, source=self.name)

    async def call(self, ref: ActorRef, request: Request[R], *, timeout: float | None = None) -> R:
        return await self.node.call(ref, request, timeout=timeout, source=self.name)

    async def lookup(self, name: str, *, timeout: float | None = None) -> ActorRef:
        return await self.node.lookup(name, timeout=timeout)

    async def spawn(
        self, name: str, factory: Callable[[], A], *, supervisor: Supervisor | None = None
    ) -> ActorRef:
        return await self.node.spawn(name, factory, supervisor=supervisor)

    def __repr__(self) -> str:
        node = getattr(self, "node", None)
        where = f"{getattr(self, 'name', '?')}@{node.name}" if node is not None else "unbound"
        return f"<{type(self).__name__} {where}>"
