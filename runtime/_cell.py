"""The runtime's side of one actor: its mailbox, its credit pool and its workers.

A cell outlives the actor instances it runs. When an instance crashes or is stopped,
the messages it was handling go back to the front of the mailbox, in arrival order,
and the next instance handles them first: a restarted actor gets its unacknowledged
input again. A message is acknowledged to its sender only once handled.

Credit: the mailbox holds ``capacity`` slots. A slot is either occupied (queued or
being handled) or granted to a remote sender node, or free. Remote senders ask for
credit when they hold none, saying how many of their messages are unacknowledged; the
ones not yet here are in transit, and keep their slots. Local senders wait for a free
slot. Freed slots go first to local senders that are waiting, then round-robin to remote
senders that asked. A message that arrives without credit (sent again after this node
restarted) is still taken, up to twice the capacity; beyond that it is refused and sent
again later.
"""

from __future__ import annotations

import itertools
import traceback
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from ._actor import Actor, Delivery, current_delivery
from ._errors import MessageRejected
from ._message import union_members
from ._wire import ERROR, OK, ErrorInfo

if TYPE_CHECKING:
    from ._node import Node, PendingCall

_YIELD_EVERY = 64


class ActorCrashed(Exception):
    """An actor's handler raised while handling a one-way message."""

    def __init__(self, name: str, message_type: str) -> None:
        super().__init__(f"actor {name!r} crashed handling {message_type}")
        self.name = name


class Envelope:
    """A message in a mailbox, with what is needed to acknowledge and answer it."""

    __slots__ = (
        "attempts",
        "call",
        "incarnation",
        "message",
        "order",
        "peer",
        "reply",
        "seq",
        "source",
        "trace",
    )

    def __init__(
        self,
        message: msgspec.Struct,
        *,
        peer: str | None = None,
        incarnation: int = 0,
        seq: int = 0,
        call: int = 0,
        reply: PendingCall | None = None,
        source: str = "",
        trace: int = 0,
    ) -> None:
        self.message = message
        self.peer = peer
        self.incarnation = incarnation
        self.seq = seq
        self.call = call
        self.reply = reply
        self.source = source
        self.trace = trace
        self.attempts = 0
        self.order = 0

    @property
    def is_call(self) -> bool:
        return self.call != 0 or self.reply is not None

    def delivery(self) -> Delivery | None:
        if self.peer is None:
            return None
        return Delivery(self.peer, self.incarnation, self.seq)


class ActorStatistics(msgspec.Struct, frozen=True):
    name: str
    actor_type: str
    running: bool
    mailbox: int
    capacity: int
    in_flight: int
    concurrency: int
    granted: int
    waiting_senders: int
    received: int
    handled: int
    failed: int
    rejected: int
    restarts: int
    dead_lettered: int


class ActorCell:
    def __init__(self, node: Node, name: str, factory: Callable[[], Actor]) -> None:
        self.node = node
        self.name = name
        self._factory = factory
        self._next_instance: Actor | None = factory()
        actor_type = type(self._next_instance)
        if actor_type.inbox is None:
            raise TypeError(
                f"{actor_type.__name__} must declare the messages it accepts: inbox = ..."
            )
        self.actor_type = actor_type
        self.inbox: Any = actor_type.inbox
        self.members = union_members(actor_type.inbox)
        self.capacity = actor_type.mailbox_size
        self.concurrency = actor_type.concurrency
        if self.capacity < 1 or self.concurrency < 1:
            raise ValueError(f"{actor_type.__name__}: mailbox_size and concurrency must be >= 1")
        self.chunk = max(1, self.capacity // 4)

        self.mailbox: deque[Envelope] = deque()
        self.in_flight: dict[int, Envelope] = {}
        self.grants: dict[str, int] = {}
        self.granted = 0
        self.held: dict[str, int] = {}
        self.waiting: deque[str] = deque()
        self._local_waiting = 0
        self._room = anyio.Event()
        self._work_waiters: deque[anyio.Event] = deque()
        self._order = itertools.count(1)
        self.running = False
        self.stopped = False

        self.received = self.handled = self.failed = self.rejected = 0
        self.restarts = self.dead_lettered = 0

    # -- credit ---------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.capacity - len(self.mailbox) - len(self.in_flight) - self.granted

    def on_credit_request(self, peer: str, outstanding: int) -> int:
        """A remote sender holds no credit: keep slots for its messages in transit and
        grant from what is free."""
        self.granted -= self.grants.pop(peer, 0)
        in_transit = max(0, outstanding - self.held.get(peer, 0))
        if in_transit:
            self.grants[peer] = in_transit
            self.granted += in_transit
        amount = min(self.free - self._local_waiting, self.chunk)
        if amount > 0:
            self.grants[peer] = self.grants.get(peer, 0) + amount
            self.granted += amount
            return amount
        if peer not in self.waiting:
            self.waiting.append(peer)
        return 0

    def on_credit_return(self, peer: str, amount: int) -> None:
        taken = min(amount, self.grants.get(peer, 0))
        if taken:
            self.grants[peer] -= taken
            self.granted -= taken
            self._distribute()

    def admit_remote(self, peer: str) -> bool:
        """Take a slot for a message arriving from ``peer``: its credit, else a free one."""
        granted = self.grants.get(peer, 0)
        if granted > 0:
            self.grants[peer] = granted - 1
            self.granted -= 1
            return True
        return len(self.mailbox) + len(self.in_flight) < 2 * self.capacity

    def _distribute(self) -> None:
        free = self.free
        if self._local_waiting and free > 0:
            self._room.set()
            self._room = anyio.Event()
            free -= self._local_waiting
        while free > 0 and self.waiting:
            peer = self.waiting[0]
            self.grants[peer] = self.grants.get(peer, 0) + 1
            self.granted += 1
            free -= 1
            self.node.grant_credit(peer, self.name, 1)
            if self.grants[peer] >= self.chunk:
                self.waiting.popleft()
            else:
                self.waiting.rotate(-1)

    # -- mailbox --------------------------------------------------------------------

    def check_type(self, message: object) -> None:
        if not isinstance(message, self.members):
            raise MessageRejected(
                f"{self.name!r} ({self.actor_type.__name__}) does not accept "
                f"{type(message).__name__}; its inbox is {self._inbox_names()}"
            )

    def _inbox_names(self) -> str:
        return " | ".join(m.__name__ for m in self.members)

    def deliver(self, envelope: Envelope) -> None:
        """Queue an admitted message (the slot was accounted for by the caller)."""
        envelope.order = next(self._order)
        self.received += 1
        if envelope.peer is not None:
            self.held[envelope.peer] = self.held.get(envelope.peer, 0) + 1
        self.mailbox.append(envelope)
        if self._work_waiters:
            self._work_waiters.popleft().set()

    async def put_local(self, envelope: Envelope) -> None:
        """Queue a message from this node, waiting for a free slot."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        while self.free <= 0:
            self._local_waiting += 1
            try:
                await self._room.wait()
            finally:
                self._local_waiting -= 1
        self.deliver(envelope)

    def put_local_nowait(self, envelope: Envelope) -> None:
        if self.free <= 0:
            raise anyio.WouldBlock
        self.deliver(envelope)

    def _finish(self, envelope: Envelope) -> None:
        del self.in_flight[envelope.order]
        self.handled += 1
        self._release(envelope)
        self._distribute()

    def _release(self, envelope: Envelope) -> None:
        if envelope.peer is not None:
            self.held[envelope.peer] -= 1
        self.node.settle(envelope)

    def dead_letter_all(self) -> None:
        """The actor is gone for good: settle what it was given, so senders let go."""
        for envelope in itertools.chain(self.in_flight.values(), self.mailbox):
            self._dead_letter(envelope, "actor stopped")
        self.in_flight.clear()
        self.mailbox.clear()
        self._distribute()

    def _dead_letter(self, envelope: Envelope, why: str) -> None:
        self.dead_lettered += 1
        self.node.log.error(
            "dead_letter",
            actor=self.name,
            message_type=type(envelope.message).__name__,
            delivery=str(envelope.delivery()),
            attempts=envelope.attempts,
            why=why,
        )
        if envelope.is_call:
            self.node.reply(
                envelope, ERROR, ErrorInfo(self.name, "DeadLetter", why), actor=self.name
            )
        self._release(envelope)

    # -- running --------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one instance of the actor until cancelled; raises ActorCrashed."""
        actor, self._next_instance = self._next_instance or self._factory(), None
        actor.name = self.name
        actor.node = self.node
        await actor.on_start()
        self.node.restore_deliveries(actor.recovered_deliveries())
        self.running = True
        task_status.started()
        crashed: list[tuple[Envelope, BaseException]] = []
        try:
            async with anyio.create_task_group() as workers:
                for _ in range(self.concurrency):
                    workers.start_soon(self._work, actor, crashed)
        except BaseExceptionGroup as group:
            _, rest = group.split(_HandlerFailed)
            if rest is not None:
                raise rest from None
        finally:
            self.running = False
            self._requeue(crashed)
            with anyio.move_on_after(self.node.config.shutdown_timeout, shield=True):
                await actor.on_stop()
        if crashed:
            envelope, error = crashed[0]
            raise ActorCrashed(self.name, type(envelope.message).__name__) from error

    def _requeue(self, crashed: list[tuple[Envelope, BaseException]]) -> None:
        for envelope, _ in crashed:
            envelope.attempts += 1
        for order in sorted(self.in_flight, reverse=True):
            envelope = self.in_flight[order]
            if envelope.attempts >= self.node.config.max_attempts:
                self._dead_letter(envelope, f"crashed the actor {envelope.attempts} times")
            else:
                self.mailbox.appendleft(envelope)
        self.in_flight.clear()
        self._distribute()

    async def _work(self, actor: Actor, crashed: list[tuple[Envelope, BaseException]]) -> None:
        since_yield = 0
        while True:
            if not self.mailbox:
                await self._wait_for_work()
                since_yield = 0
                continue
            # One message per call, so its locals go when it returns: a worker waiting
            # for work held on to the last message it handled, and an engine's 1024
            # idle workers each to a bucket of weights.
            await self._handle(actor, self.mailbox.popleft(), crashed)
            since_yield += 1
            if since_yield >= _YIELD_EVERY:
                since_yield = 0
                await anyio.lowlevel.checkpoint()

    async def _handle(
        self, actor: Actor, envelope: Envelope, crashed: list[tuple[Envelope, BaseException]]
    ) -> None:
        self.in_flight[envelope.order] = envelope
        token = current_delivery.set(envelope.delivery())
        try:
            result = await actor.handle(envelope.message)
        except Exception as error:
            self.failed += 1
            if not envelope.is_call:
                self.node.log.error(
                    "actor_crashed",
                    actor=self.name,
                    message_type=type(envelope.message).__name__,
                    error=f"{type(error).__name__}: {error}",
                )
                crashed.append((envelope, error))
                raise _HandlerFailed from error
            status, result = (
                ERROR,
                ErrorInfo(
                    self.name,
                    type(error).__name__,
                    str(error),
                    traceback.format_exc(),
                ),
            )
        else:
            status = OK
        finally:
            current_delivery.reset(token)
        # Acknowledge first: the ack and any credit it frees leave with the reply.
        self._finish(envelope)
        if envelope.is_call:
            self.node.reply(envelope, status, result, actor=self.name)

    async def _wait_for_work(self) -> None:
        event = anyio.Event()
        self._work_waiters.append(event)
        try:
            await event.wait()
        except BaseException:
            if event in self._work_waiters:
                self._work_waiters.remove(event)
            elif self.mailbox and self._work_waiters:
                self._work_waiters.popleft().set()  # pass on the wake-up we were given
            raise

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(
            name=self.name,
            actor_type=self.actor_type.__name__,
            running=self.running,
            mailbox=len(self.mailbox),
            capacity=self.capacity,
            in_flight=len(self.in_flight),
            concurrency=self.concurrency,
            granted=self.granted,
            waiting_senders=len(self.waiting),
            received=self.received,
            handled=self.handled,
            failed=self.failed,
            rejected=self.rejected,
            restarts=self.restarts,
            dead_lettered=self.dead_lettered,
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped" if self.stopped else "idle"
        return (
            f"<Actor {self.name}@{self.node.name} {self.actor_type.__name__} {state} "
            f"[mailbox {len(self.mailbox)}/{self.capacity} | in-flight "
            f"{len(self.in_flight)}/{self.concurrency} | granted {self.granted} | "
            f"handled {self.handled} failed {self.failed} rejected {self.rejected} "
            f"restarts {self.restarts}]>"
        )


class _HandlerFailed(Exception):
    """Internal: unwinds the workers of an instance whose handler raised."""
