"""A node: one OS process, one event loop, many actors, one link per peer node.

The node routes: messages for local actors go straight into their mailboxes (as
objects, never encoded); messages for remote actors are encoded once and handed to the
peer's link. Inbound batches are decoded here, synchronously, inside the transport's
watcher task, so a burst of small messages costs one task switch per batch rather than
one per message. The envelope (item) is decoded first and the payload only against the
target actor's inbox, so a bad payload fails that one message.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import msgspec

from ._actor import Actor, Delivery
from ._cell import ActorCell, ActorStatistics, Envelope
from ._codec import Codec
from ._config import NodeConfig
from ._errors import (
    ActorNotFound,
    CallTimeout,
    FrameError,
    MessageRejected,
    PeerUnavailable,
    RemoteError,
    SupervisionEscalated,
    first_leaf,
)
from ._link import Link, LinkState, LinkStatistics, Seen
from ._log import get_logger
from ._message import ActorRef, Request, reply_type_of
from ._registry import REGISTRY, Lookup, Register, Registry, Unregister
from ._supervisor import Strategy, Supervisor
from ._transport import Buffer, Connection, Endpoint, Transport
from ._wire import (
    ERROR,
    NOT_FOUND,
    OK,
    REJECTED,
    Ack,
    CreditDenied,
    CreditGrant,
    CreditRequest,
    CreditReturn,
    Data,
    DataOut,
    ErrorInfo,
    Header,
    Nack,
    Reply,
    ReplyOut,
    decode_error,
    decode_header,
    decode_item,
    encode_batch,
)

if TYPE_CHECKING:
    from ._zmq import CurveKeys

R = TypeVar("R")
A = TypeVar("A", bound=Actor)

_current_trace: ContextVar[int] = ContextVar("current_trace", default=0)


class NodeStatistics(msgspec.Struct, frozen=True):
    name: str
    incarnation: int
    address: str
    actors: list[ActorStatistics]
    links: list[LinkStatistics]
    rejected: dict[str, int]
    batches_received: int
    calls_pending: int


class PendingCall:
    """A call waiting for its reply (or for its failure)."""

    __slots__ = ("error", "event", "frames", "link", "payload", "seq", "status", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.status = -1
        self.payload: msgspec.Raw | None = None
        self.frames: list[Buffer] = []
        self.value: Any = None
        self.error: Exception | None = None
        self.link: Link | None = None
        self.seq = 0

    def resolve(self, status: int, payload: msgspec.Raw, frames: list[Buffer]) -> None:
        self.status, self.payload, self.frames = status, payload, frames
        self.event.set()

    def resolve_local(self, status: int, value: Any) -> None:
        self.status, self.value = status, value
        self.event.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.event.set()

    def result(self, reply_type: Any, codec: Codec, target: ActorRef, request: str) -> Any:
        if self.error is not None:
            raise self.error
        if self.payload is None:  # answered by a local actor: objects, not bytes
            if self.status == OK:
                return self.value
            info: ErrorInfo = self.value
        else:
            if self.status == OK:
                try:
                    return codec.decode(self.payload, self.frames, reply_type)
                except FrameError as exc:
                    raise MessageRejected(
                        f"the reply of {target} to {request} is not a valid "
                        f"{getattr(reply_type, '__name__', reply_type)}: {exc.detail}"
                    ) from None
            info = decode_error(self.payload)
        if self.status == REJECTED:
            raise MessageRejected(f"{target} rejected {request}: {info.message}")
        if self.status == NOT_FOUND:
            raise ActorNotFound(info.message)
        raise RemoteError(info.actor, info.type_name, info.message, info.traceback)


class Node:
    """Create with ``open_node``; every method is safe to call from any task of it."""

    def __init__(self, name: str, config: NodeConfig, head: str | None) -> None:
        self.name = name
        self.config = config
        self.incarnation = random.getrandbits(63) | 1
        self.address = ""
        self.is_head = head is None
        self.log = get_logger(node=name)
        self._head_name = name
        self._joining: dict[Connection, str] = {}
        self._joined = anyio.Event()
        self._cells: dict[str, ActorCell] = {}
        self._supervisor_of: dict[str, Supervisor] = {}
        self._links: dict[str, Link] = {}
        self._addresses: dict[str, str] = {}
        self._names: dict[str, ActorRef] = {}
        self._calls: dict[int, PendingCall] = {}
        self._call_ids = itertools.count(random.getrandbits(40) + 1)
        self._preseen: dict[tuple[str, int], list[int]] = {}
        self._codec = Codec()
        self._rejected: Counter[str] = Counter()
        self._last_logged: dict[str, tuple[float, int]] = {}
        self._batches_received = 0
        self._endpoint: Endpoint | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self.root = Supervisor(self, "root", strategy="one_for_one", intensity=10, period=10.0)
        self._root_scope = anyio.CancelScope()
        self._root_done = anyio.Event()

    # -- actors ---------------------------------------------------------------------

    async def spawn(
        self, name: str, factory: Callable[[], A], *, supervisor: Supervisor | None = None
    ) -> ActorRef:
        """Start an actor under ``supervisor`` (the node's root by default), register
        its name on the head node and return its address once ``on_start`` is done."""
        if not name or len(name.encode()) > 255:
            raise ValueError(f"actor names must be 1 to 255 bytes, got {name!r}")
        if name in self._cells:
            raise ValueError(f"an actor named {name!r} already runs on node {self.name!r}")
        cell = ActorCell(self, name, factory)
        parent = supervisor or self.root
        self._cells[name] = cell
        try:
            await parent.start_child(cell)
        except BaseException:
            del self._cells[name]
            raise
        self._supervisor_of[name] = parent
        if name != REGISTRY:
            try:
                await self.call(self._registry, Register(name, self.name, self.address))
            except BaseException:
                await self.stop(name, unregister=False)
                raise
        return ActorRef(self.name, name)

    async def stop(self, name: str, *, unregister: bool = True) -> None:
        """Stop a local actor for good; what was queued for it is dead-lettered."""
        cell = self._cells.pop(name, None)
        if cell is None:
            raise ActorNotFound(f"no actor named {name!r} on node {self.name!r}")
        await self._supervisor_of.pop(name).stop_child(name)
        cell.stopped = True
        cell.dead_letter_all()
        self._names.pop(name, None)
        if unregister:
            await self.call(self._registry, Unregister(name, self.name))

    async def start_supervisor(
        self,
        name: str,
        *,
        strategy: Strategy = "one_for_one",
        intensity: int = 3,
        period: float = 5.0,
        supervisor: Supervisor | None = None,
    ) -> Supervisor:
        """A supervisor for actors spawned with ``supervisor=`` it, itself supervised."""
        child = Supervisor(self, name, strategy=strategy, intensity=intensity, period=period)
        await (supervisor or self.root).start_child(child)
        return child

    @property
    def _registry(self) -> ActorRef:
        return ActorRef(self._head_name, REGISTRY)

    async def lookup(self, name: str, *, timeout: float | None = None) -> ActorRef:
        """Where the actor registered as ``name`` lives, waiting up to ``timeout``
        seconds for it to be registered. Raises ActorNotFound."""
        if name in self._cells:
            return ActorRef(self.name, name)
        ref = self._names.get(name)
        if ref is not None:
            return ref
        wait = self.config.call_timeout if timeout is None else timeout
        location = await self.call(
            self._registry, Lookup(name, wait), timeout=wait + self.config.heartbeat_timeout
        )
        if not location.found:
            raise ActorNotFound(f"no actor is registered as {name!r} (waited {wait} s)")
        if location.node != self.name:
            self._addresses[location.node] = location.address
        ref = ActorRef(location.node, name)
        self._names[name] = ref
        return ref

    def peer_is_up(self, node: str) -> bool:
        if node == self.name:
            return True
        link = self._links.get(node)
        return link is not None and link.state is LinkState.UP

    # -- sending --------------------------------------------------------------------

    def _local_cell(self, ref: ActorRef) -> ActorCell:
        cell = self._cells.get(ref.name)
        if cell is None:
            raise ActorNotFound(f"no actor named {ref.name!r} on node {self.name!r}")
        return cell

    @staticmethod
    def _trace() -> int:
        return _current_trace.get() or random.getrandbits(63)

    async def send(self, ref: ActorRef, message: msgspec.Struct, *, source: str = "") -> None:
        """Deliver ``message`` to ``ref`` at least once; waits while the target has no
        room (credit) for it."""
        if ref.node == self.name:
            cell = self._local_cell(ref)
            cell.check_type(message)
            await cell.put_local(Envelope(message, source=source, trace=self._trace()))
            return
        link = self._link_to(ref)
        await link.acquire_credit(ref.name)
        self._enqueue(link, ref.name, message, source, 0)

    def send_nowait(self, ref: ActorRef, message: msgspec.Struct, *, source: str = "") -> None:
        """``send`` without waiting: raises ``anyio.WouldBlock`` when there is no credit
        (credit is then requested, so a later attempt can succeed)."""
        if ref.node == self.name:
            cell = self._local_cell(ref)
            cell.check_type(message)
            cell.put_local_nowait(Envelope(message, source=source, trace=self._trace()))
            return
        link = self._link_to(ref)
        link.take_credit_nowait(ref.name)
        self._enqueue(link, ref.name, message, source, 0)

    def _enqueue(self, link: Link, target: str, message: Any, source: str, call: int) -> int:
        seq = link.next_seq()
        try:
            data, frames = self._codec.encode(
                DataOut(seq, target, source, call, self._trace(), message)
            )
        except Exception:
            # The message never leaves: its credit goes back to the pool. Its sequence
            # number is skipped, which the peer reads from the next batch's base.
            link.return_credit(target)
            raise
        link.enqueue(seq, target, data, frames, call, urgent=call != 0)
        return seq

    async def call(
        self,
        ref: ActorRef,
        request: Request[R],
        *,
        timeout: float | None = None,
        source: str = "",
    ) -> R:
        """Send ``request`` and wait for the reply, decoded as the request's reply type.

        Raises RemoteError (the handler raised), MessageRejected, ActorNotFound,
        CallTimeout (no reply within ``timeout``, default ``NodeConfig.call_timeout``)
        or PeerUnavailable (the target's node is down).
        """
        reply_type = reply_type_of(type(request))
        limit = self.config.call_timeout if timeout is None else timeout
        pending = PendingCall()
        call_id = next(self._call_ids)
        try:
            with anyio.fail_after(limit):
                if ref.node == self.name:
                    cell = self._local_cell(ref)
                    cell.check_type(request)
                    envelope = Envelope(request, reply=pending, source=source, trace=self._trace())
                    await cell.put_local(envelope)
                else:
                    link = self._link_to(ref)
                    if link.state is LinkState.DOWN:
                        raise PeerUnavailable(
                            f"node {ref.node!r} is down (no heartbeat for "
                            f"{self.config.heartbeat_timeout} s); cannot call {ref}"
                        )
                    await link.acquire_credit(ref.name, unless_down=True)
                    pending.link = link
                    self._calls[call_id] = pending
                    pending.seq = self._enqueue(link, ref.name, request, source, call_id)
                await pending.event.wait()
        except TimeoutError:
            raise CallTimeout(
                f"{type(request).__name__} to {ref} got no reply within {limit} s"
            ) from None
        finally:
            self._calls.pop(call_id, None)
            if pending.link is not None and not pending.event.is_set():
                pending.link.forget(pending.seq)
        result: R = pending.result(reply_type, self._codec, ref, type(request).__name__)
        return result

    # -- for cells ------------------------------------------------------------------

    def settle(self, envelope: Envelope) -> None:
        """The envelope is done with: acknowledge it to the node that sent it."""
        if envelope.peer is not None:
            link = self._links.get(envelope.peer)
            if link is not None:
                link.settle(envelope.seq, envelope.incarnation)

    def reply(self, envelope: Envelope, status: int, payload: Any, *, actor: str) -> None:
        if envelope.reply is not None:
            envelope.reply.resolve_local(status, payload)
            return
        link = self._links.get(envelope.peer or "")
        if link is None or link.peer_incarnation != envelope.incarnation:
            return  # the caller's process is gone
        try:
            data, frames = self._codec.encode(ReplyOut(envelope.call, status, payload))
        except (TypeError, ValueError, OverflowError) as exc:
            data, frames = self._codec.encode(
                ReplyOut(
                    envelope.call,
                    ERROR,
                    ErrorInfo(
                        actor,
                        type(exc).__name__,
                        f"the reply could not be encoded: {exc}",
                    ),
                )
            )
        link.queue_reply(data, frames)

    def grant_credit(self, peer: str, target: str, amount: int) -> None:
        link = self._links.get(peer)
        if link is not None:
            link.queue_grant(target, amount)

    def restore_deliveries(self, deliveries: Iterable[Delivery]) -> None:
        by_peer: dict[tuple[str, int], list[int]] = {}
        for delivery in deliveries:
            by_peer.setdefault((delivery.node, delivery.incarnation), []).append(delivery.seq)
        for (peer, incarnation), seqs in by_peer.items():
            link = self._links.get(peer)
            if link is not None and link.peer_incarnation == incarnation:
                link.restore_settled(seqs)
            else:
                self._preseen.setdefault((peer, incarnation), []).extend(seqs)

    # -- links ----------------------------------------------------------------------

    def _link_to(self, ref: ActorRef) -> Link:
        """The link to send to ``ref`` on. A node that never connected here and whose
        address this node never learned cannot be reached: fail at once, not by a
        timeout."""
        if ref.node not in self._links and ref.node not in self._addresses:
            raise PeerUnavailable(
                f"no address is known for node {ref.node!r} (target {ref}): take refs to "
                "actors on other nodes from lookup(), which learns their node's address"
            )
        return self._link_for(ref.node)

    def _link_for(self, peer: str, dialed: Connection | None = None) -> Link:
        link = self._links.get(peer)
        if link is None:
            if peer == self.name:
                raise ValueError(f"node {self.name!r} cannot link to itself")
            if len(self._links) >= self.config.max_peers:
                raise FrameError("too_many_peers", f"already linked to {len(self._links)} nodes")
            assert self._tasks is not None, "the node is not running"
            link = Link(self.name, self.incarnation, peer, self.config, anyio.current_time())
            self._links[peer] = link
            self._tasks.start_soon(link.run_flusher)
        if dialed is not None:
            link.attach(dialed, dialed=True)
        elif link.connection is None:
            self._dial(link)
        return link

    def _dial(self, link: Link) -> None:
        address = self._addresses.get(link.peer)
        if address is not None and not link.dialed and self._endpoint is not None:
            link.attach(self._endpoint.dial(address), dialed=True)
            link.flush_nowait(heartbeat=True)

    async def _join(self, address: str) -> None:
        """Dial the head and learn its name from its first answer."""
        connection = self._endpoint_or_fail().dial(address)
        self._joining[connection] = address
        hello = encode_batch(self.name, self.incarnation, 0, 0, 0, 0, [])
        with anyio.fail_after(self.config.call_timeout):
            while not self._joined.is_set():
                with contextlib.suppress(anyio.WouldBlock):
                    connection.send_nowait(hello)
                with anyio.move_on_after(self.config.heartbeat_interval):
                    await self._joined.wait()

    def _endpoint_or_fail(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError(f"node {self.name!r} is not running")
        return self._endpoint

    def _on_frames(self, connection: Connection, frames: list[Buffer]) -> None:
        """Handle one inbound batch; called by the transport, never awaits."""
        try:
            header = decode_header(frames, self.config.max_frame_bytes)
            if header.sender == self.name or not header.sender:
                raise FrameError("bad_sender", f"a batch claims to come from {header.sender!r}")
            if connection.identity is not None and connection.identity != header.sender:
                raise FrameError(
                    "bad_sender",
                    (
                        f"a peer that connected as {connection.identity!r} claims to be "
                        f"{header.sender!r}"
                    ),
                )
            joined = self._joining.pop(connection, None)
            if joined is not None:
                self._addresses[header.sender] = joined
                self._head_name = header.sender
                self._joined.set()
            link = self._link_for(header.sender, connection if joined is not None else None)
        except FrameError as exc:
            self._reject(exc, via=repr(connection))
            return
        self._batches_received += 1
        if not link.dialed and link.connection is not connection:
            link.attach(connection, dialed=False)
        elif link.connection is not connection and not header.items:
            # A hello (or heartbeat) over a connection this link does not send on: answer
            # on that one, so a node that is joining hears back where it is listening.
            link.answer_on(connection)
        came_up, restarted = link.on_header(header, anyio.current_time())
        if came_up or restarted:
            self.log.info(
                "peer_restarted" if restarted else "peer_up",
                peer=link.peer,
                incarnation=header.incarnation,
                unacked=link.unacked,
            )
            seqs = self._preseen.pop((link.peer, header.incarnation), None)
            if seqs:
                link.restore_settled(seqs)
        self._dispatch(link, header, frames)

    def _dispatch(self, link: Link, header: Header, frames: list[Buffer]) -> None:
        answers_us = header.peer_incarnation == self.incarnation
        cursor = 1
        for count, raw in header.items:
            item_frames = frames[cursor : cursor + count]
            cursor += count
            try:
                item = decode_item(raw)
            except FrameError as exc:
                self._reject(exc, peer=link.peer)
                continue
            if isinstance(item, Data):
                self._on_data(link, item, item_frames)
            elif isinstance(item, CreditRequest):
                self._on_credit_request(link, item)
            elif not answers_us:
                self._rejected["stale"] += 1  # an answer meant for our previous incarnation
            elif isinstance(item, Ack):
                link.on_ack(item.seqs)
            elif isinstance(item, Reply):
                self._on_reply(item, item_frames)
            elif isinstance(item, CreditGrant):
                link.on_grant(item.target, item.amount)
            elif isinstance(item, Nack):
                link.on_nack(item.seq)
            elif isinstance(item, CreditReturn):
                cell = self._cells.get(item.target)
                if cell is not None:
                    cell.on_credit_return(link.peer, item.amount)
            elif isinstance(item, CreditDenied):
                link.on_denied(item.target)

    def _on_data(self, link: Link, item: Data, frames: list[Buffer]) -> None:
        seen = link.seen(item.seq)
        if seen is Seen.PENDING:
            return
        if seen is Seen.SETTLED:
            link.ack_again(item.seq)
            return
        cell = self._cells.get(item.target)
        if cell is None:
            missing = f"no actor named {item.target!r} on node {self.name!r}"
            self._reject(FrameError("unknown_actor", missing), peer=link.peer)
            if item.call:
                link.mark_received(item.seq)
                self._reply_error(link, item.call, NOT_FOUND, item.target, missing)
                link.settle(item.seq, link.peer_incarnation)
            else:
                link.nack(item.seq, "unknown actor")
            return
        try:
            message = self._codec.decode(item.payload, frames, cell.inbox)
        except FrameError as exc:
            cell.rejected += 1
            self._reject(exc, peer=link.peer, actor=item.target)
            link.mark_received(item.seq)
            if item.call:
                self._reply_error(link, item.call, REJECTED, item.target, exc.detail)
            link.settle(item.seq, link.peer_incarnation)
            return
        if not cell.admit_remote(link.peer):
            self._rejected["over_credit"] += 1
            link.nack(item.seq, "far over credit")
            return
        link.mark_received(item.seq)
        cell.deliver(
            Envelope(
                message,
                peer=link.peer,
                incarnation=link.peer_incarnation,
                seq=item.seq,
                call=item.call,
                source=item.source,
                trace=item.trace,
            )
        )

    def _reply_error(self, link: Link, call: int, status: int, actor: str, message: str) -> None:
        data, frames = self._codec.encode(ReplyOut(call, status, ErrorInfo(actor, "", message)))
        link.queue_reply(data, frames)

    def _on_credit_request(self, link: Link, request: CreditRequest) -> None:
        cell = self._cells.get(request.target)
        if cell is None:
            link.queue_denied(request.target)
            return
        amount = cell.on_credit_request(link.peer, request.outstanding)
        if amount:
            link.queue_grant(request.target, amount)

    def _on_reply(self, item: Reply, frames: list[Buffer]) -> None:
        pending = self._calls.get(item.call)
        if pending is None:
            self._rejected["late_reply"] += 1
            return
        pending.resolve(item.status, item.payload, frames)

    def _reject(self, error: FrameError, **where: str) -> None:
        """Count a rejection; log it, at most once a second per reason."""
        self._rejected[error.reason] += 1
        now = anyio.current_time()
        last, suppressed = self._last_logged.get(error.reason, (-float("inf"), 0))
        if now - last < 1.0:
            self._last_logged[error.reason] = (last, suppressed + 1)
            return
        self._last_logged[error.reason] = (now, 0)
        self.log.warning(
            "rejected", reason=error.reason, detail=error.detail, suppressed=suppressed, **where
        )

    def _on_peer_down(self, link: Link) -> None:
        failed = 0
        for call_id in link.forget_calls():
            pending = self._calls.get(call_id)
            if pending is not None:
                pending.fail(
                    PeerUnavailable(
                        f"node {link.peer!r} stopped answering (no heartbeat for "
                        f"{self.config.heartbeat_timeout} s)"
                    )
                )
                failed += 1
        self.log.warning("peer_down", peer=link.peer, unacked=link.unacked, calls_failed=failed)

    async def _tick(self) -> None:
        interval = min(self.config.heartbeat_interval, self.config.resend_interval) / 2
        while True:
            await anyio.sleep(interval)
            now = anyio.current_time()
            for link in list(self._links.values()):
                if link.connection is None:
                    self._dial(link)
                if link.tick(now):
                    self._on_peer_down(link)

    async def _run_root(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with self._root_scope:
                await self.root.run(task_status=task_status)
        finally:
            self._root_done.set()

    async def _stop_actors(self) -> None:
        self._root_scope.cancel()
        await self._root_done.wait()

    async def wait_acknowledged(self) -> None:
        """Wait until every data message this node has sent was handled by its
        receiver (bound it with a timeout: a peer that is down never answers)."""
        while any(link.unacked for link in self._links.values()):
            for link in list(self._links.values()):
                await link.wait_acknowledged()

    async def _drain(self) -> None:
        """Flush acknowledgements and wait (bounded) until peers have acknowledged
        everything this node sent: what the process takes with it when it exits is
        only what nobody accepted."""
        with anyio.move_on_after(self.config.shutdown_timeout):
            for link in list(self._links.values()):
                link.wake()
                if link.state is not LinkState.DOWN:
                    await link.wait_acknowledged()
        left = {link.peer: link.unacked for link in self._links.values() if link.unacked}
        if left:
            self.log.warning("unacknowledged_at_exit", unacked=left)

    # -- introspection --------------------------------------------------------------

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(
            name=self.name,
            incarnation=self.incarnation,
            address=self.address,
            actors=[cell.statistics() for cell in self._cells.values()],
            links=[link.statistics() for link in self._links.values()],
            rejected=dict(self._rejected),
            batches_received=self._batches_received,
            calls_pending=len(self._calls),
        )

    def link_statistics(self, peer: str) -> LinkStatistics:
        return self._links[peer].statistics()

    def actor_statistics(self, name: str) -> ActorStatistics:
        return self._local_cell(ActorRef(self.name, name)).statistics()

    def __repr__(self) -> str:
        up = sum(1 for link in self._links.values() if link.state is LinkState.UP)
        rejected = sum(self._rejected.values())
        return (
            f"<Node {self.name} {'head' if self.is_head else 'worker'} at {self.address} "
            f"[actors {len(self._cells)} | links {up}/{len(self._links)} up | calls pending "
            f"{len(self._calls)} | rejected {rejected}]>"
        )


@asynccontextmanager
async def open_node(
    name: str,
    *,
    listen: str = "tcp://127.0.0.1:*",
    head: str | None = None,
    config: NodeConfig | None = None,
    transport: Transport | None = None,
    keys: CurveKeys | None = None,
    advertise: str | None = None,
) -> AsyncIterator[Node]:
    """Run a node for the duration of the block.

    Without ``head`` this node is the head and hosts the registry; otherwise ``head``
    is the head's address (its name is learned when it first answers). ``listen`` defaults to
    loopback: a node is reachable from other hosts only if it is told to listen there.
    The transport follows the address (ZeroMQ for tcp:// and ipc://); ``mem://``
    addresses need ``transport=MemoryNetwork()`` shared by the nodes of a test. With
    ``keys`` (a cluster's, from ``load_cluster_keys``) every link is authenticated and
    encrypted with CURVE, and peers without those keys cannot connect. ``advertise`` is
    the address other nodes are told to reach this one at, where that is not the one it
    listens on (a proxy or a NAT between them).

    Leaving the block stops the actors, then waits up to ``shutdown_timeout`` for
    peers to acknowledge what this node sent.
    """
    if not name or len(name.encode()) > 255:
        raise ValueError(f"node names must be 1 to 255 bytes, got {name!r}")
    config = config or NodeConfig()
    if transport is None:
        if not listen.startswith(("tcp://", "ipc://")):
            raise ValueError(f"no transport for {listen!r}: pass transport= for mem:// addresses")
        from ._zmq import ZmqTransport

        transport = ZmqTransport(max_message_bytes=2 * config.max_frame_bytes, curve=keys)
    elif keys is not None:
        raise ValueError("keys go to the transport when one is passed: ZmqTransport(curve=...)")
    node = Node(name, config, head)
    try:
        async with transport.open(name, node._on_frames) as endpoint:
            node._endpoint = endpoint
            node.address = await endpoint.listen(listen)
            if advertise is not None:
                node.address = advertise
            async with anyio.create_task_group() as tasks:
                node._tasks = tasks
                tasks.start_soon(node._tick)
                await tasks.start(node._run_root)
                if head is None:
                    await node.spawn(REGISTRY, Registry)
                else:
                    await node._join(head)
                node.log.info("node_started", address=node.address, head=head or node.address)
                try:
                    yield node
                finally:
                    with anyio.CancelScope(shield=True):
                        await node._stop_actors()
                        await node._drain()
                    tasks.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        escalated = first_leaf(group, SupervisionEscalated)
        if escalated is None:
            raise
        raise escalated from None
    finally:
        node.log.info("node_stopped", rejected=dict(node._rejected))
