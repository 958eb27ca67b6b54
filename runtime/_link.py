"""One node's view of its connection to one peer node.

A link owns everything that makes delivery reliable and bounded, independent of the
transport underneath:

* **sequencing**: every data message gets the next sequence number of this link;
* **at-least-once**: a data message stays in ``unacked`` until the peer acknowledges
  that it was handled, by an ack or by the settled mark every batch header carries;
  it is sent again when the peer restarts (a new incarnation) and, if the peer never
  reported it received, after ``resend_interval``;
* **de-duplication** of what the peer sends us, by sequence number: a contiguous
  high-water mark plus the set received above it;
* **credit**: a sender may have at most as many messages in flight to an actor as
  that actor's node granted; with none it asks and waits;
* **coalescing**: items queued while the event loop is busy leave in one batch;
* **heartbeats**: a batch at least every ``heartbeat_interval``; silence for
  ``heartbeat_timeout`` marks the peer down.

The node drives it: it feeds inbound items in, and runs ``run_flusher`` and ``tick``.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import Iterable, Sequence

import anyio
import anyio.lowlevel
import msgspec

from ._config import NodeConfig
from ._errors import ActorNotFound, PeerUnavailable
from ._transport import Buffer, Connection
from ._wire import (
    Ack,
    CreditDenied,
    CreditGrant,
    CreditRequest,
    CreditReturn,
    Header,
    Nack,
    encode_batch,
    encode_item,
)

_MAX_ACKS_PER_ITEM = 4096


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


class Seen(enum.Enum):
    """What a data sequence number from the peer is, to this link."""

    NEW = "new"
    PENDING = "pending"  # received, not yet handled: its ack will follow
    SETTLED = "settled"  # handled before: acknowledge it again


class LinkStatistics(msgspec.Struct, frozen=True):
    peer: str
    state: str
    peer_incarnation: int
    unacked: int
    outbox: int
    credit: dict[str, int]
    sent: int
    received: int
    resent: int
    duplicates: int
    batches_sent: int
    batches_received: int
    blocked: int


class _Pending:
    """A data message kept until the peer acknowledges it."""

    __slots__ = (
        "call",
        "data",
        "frames",
        "nacked",
        "nbytes",
        "queued",
        "sent_at",
        "seq",
        "target",
    )

    def __init__(self, seq: int, target: str, data: bytes, frames: list[Buffer], call: int) -> None:
        self.seq = seq
        self.target = target
        self.data = data
        self.frames = frames
        self.nbytes = len(data) + sum(memoryview(f).nbytes for f in frames)
        self.call = call
        self.queued = True
        self.nacked = False
        self.sent_at = 0.0


class _Credit:
    """What this node may still send to one actor on the peer."""

    __slots__ = (
        "balance",
        "denied",
        "granted_before",
        "last_used",
        "outstanding",
        "requested_at",
        "waiter",
    )

    def __init__(self) -> None:
        self.balance = 0
        self.outstanding = 0
        self.denied = False
        self.granted_before = False
        self.last_used = 0.0
        self.requested_at: float | None = None
        self.waiter: anyio.Event | None = None

    def wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None


class Link:
    def __init__(
        self, local: str, incarnation: int, peer: str, config: NodeConfig, now: float
    ) -> None:
        self.local = local
        self.incarnation = incarnation
        self.peer = peer
        self.config = config
        self.connection: Connection | None = None
        self.dialed = False
        self.state = LinkState.CONNECTING
        self.since = now
        self.peer_incarnation = 0
        self.last_sent = -float("inf")
        self.last_received = now

        self._next_seq = 1
        self._unacked: dict[int, _Pending] = {}
        self._outbox: deque[_Pending] = deque()
        self._outbox_bytes = 0  # what was enqueued since the outbox was last empty
        self._replies: deque[tuple[bytes, Sequence[Buffer]]] = deque()
        self._acks: list[int] = []
        self._nacks: list[tuple[int, str]] = []
        self._requests: set[str] = set()
        self._grants: dict[str, int] = {}
        self._returns: dict[str, int] = {}
        self._denied: set[str] = set()
        self._credits: dict[str, _Credit] = {}
        self._peer_received = 0

        self._recv_hwm = 0
        self._recv_above: set[int] = set()
        self._recv_pending: set[int] = set()

        self._wake = anyio.Event()
        self._connected = anyio.Event()
        self._acknowledged: anyio.Event | None = None

        self._sent = self._received = self._resent = self._duplicates = 0
        self._batches_sent = self._batches_received = self._blocked = 0

    # -- connection and state -------------------------------------------------------

    def attach(self, connection: Connection, *, dialed: bool) -> None:
        self.connection = connection
        self.dialed = dialed
        self._connected.set()
        self.wake()

    def on_header(self, header: Header, now: float) -> tuple[bool, bool]:
        """Take in a batch header; returns (came up, peer restarted)."""
        self.last_received = now
        self._batches_received += 1
        previous = self.peer_incarnation
        if header.incarnation != previous:
            self._on_peer_incarnation(header.incarnation)
        came_up = self.state is not LinkState.UP
        if came_up:
            self.state = LinkState.UP
            self.since = now
        if header.base > self._recv_hwm:
            self._recv_hwm = header.base
            self._recv_above = {s for s in self._recv_above if s > header.base}
            self._advance_hwm()
        if header.peer_incarnation == self.incarnation:
            if header.received > self._peer_received:
                self._peer_received = header.received
            self._settle_through(header.settled)
        restarted = previous not in (0, header.incarnation)
        if restarted or came_up:
            self.wake()  # tell the peer who we are now, and resend
        return came_up, restarted

    def _on_peer_incarnation(self, incarnation: int) -> None:
        first_contact = self.peer_incarnation == 0
        self.peer_incarnation = incarnation
        self._recv_hwm = 0
        self._recv_above.clear()
        self._recv_pending.clear()
        self._peer_received = 0
        if first_contact:
            return
        # Grants of the old incarnation are void; what it had not acknowledged, it lost.
        self._acks.clear()
        self._nacks.clear()
        self._grants.clear()
        self._denied.clear()
        for credit in self._credits.values():
            credit.balance = 0
            credit.requested_at = None
            credit.wake()
        self._outbox.clear()
        for pending in self._unacked.values():
            pending.queued = True
            self._outbox.append(pending)
            self._resent += 1

    def mark_down(self, now: float) -> None:
        self.state = LinkState.DOWN
        self.since = now
        for credit in self._credits.values():
            credit.wake()  # a call waiting for credit gives up; a send waits on

    # -- outbound data --------------------------------------------------------------

    async def acquire_credit(self, target: str, *, unless_down: bool = False) -> None:
        """Take one credit for ``target``, asking the peer for more and waiting if
        there is none. Raises ActorNotFound if the peer has no such actor, and, with
        ``unless_down``, PeerUnavailable if the link is or goes down while waiting: a
        call cannot be answered by a node that is down, a one-way send can wait."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        credit = self._credits.get(target)
        if credit is None:
            credit = self._credits[target] = _Credit()
        while credit.balance <= 0:
            if unless_down and self.state is LinkState.DOWN:
                raise PeerUnavailable(
                    f"node {self.peer!r} went down while a call to {target!r} waited for credit"
                )
            self._ask(target, credit)
            if credit.waiter is None:
                credit.waiter = anyio.Event()
            await credit.waiter.wait()
        credit.balance -= 1
        credit.last_used = anyio.current_time()

    def take_credit_nowait(self, target: str) -> None:
        """Take one credit or raise ``anyio.WouldBlock`` (having asked for more)."""
        credit = self._credits.get(target)
        if credit is None:
            credit = self._credits[target] = _Credit()
        if credit.balance <= 0:
            self._ask(target, credit)
            raise anyio.WouldBlock
        credit.balance -= 1
        credit.last_used = anyio.current_time()

    def _ask(self, target: str, credit: _Credit) -> None:
        if credit.denied:
            if self._credits.get(target) is credit:
                del self._credits[target]
            raise ActorNotFound(f"no actor named {target!r} on node {self.peer!r}")
        if credit.requested_at is None:
            credit.requested_at = anyio.current_time()
            self._requests.add(target)
            self.wake()

    def return_credit(self, target: str) -> None:
        """Give back a credit taken for a message that could not be encoded."""
        credit = self._credits.get(target)
        if credit is not None:
            credit.balance += 1
            credit.wake()

    def next_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def enqueue(
        self, seq: int, target: str, data: bytes, frames: list[Buffer], call: int, *, urgent: bool
    ) -> None:
        pending = _Pending(seq, target, data, frames, call)
        self._unacked[seq] = pending
        credit = self._credits.get(target)
        if credit is not None:
            credit.outstanding += 1
        self._outbox.append(pending)
        self._outbox_bytes += pending.nbytes
        self._sent += 1
        if (
            urgent
            or len(self._outbox) >= self.config.batch_items
            or self._outbox_bytes >= self.config.batch_bytes
        ):
            self.flush_nowait()
        else:
            self.wake()

    def forget(self, seq: int) -> None:
        """Stop delivering ``seq`` (its caller gave up waiting)."""
        self._settled(self._unacked.pop(seq, None))
        self._check_acknowledged()

    def _settled(self, pending: _Pending | None) -> None:
        if pending is not None:
            credit = self._credits.get(pending.target)
            if credit is not None and credit.outstanding > 0:
                credit.outstanding -= 1

    def forget_calls(self) -> list[int]:
        """Drop every unacknowledged call request; returns their call ids."""
        calls = []
        for pending in [p for p in self._unacked.values() if p.call]:
            calls.append(pending.call)
            self._settled(self._unacked.pop(pending.seq))
        self._check_acknowledged()
        return calls

    def on_ack(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self._settled(self._unacked.pop(seq, None))
        self._check_acknowledged()

    def _settle_through(self, settled: int) -> None:
        """The peer has handled every sequence number up to ``settled``: an ack lost
        with a dropped connection would otherwise leave its message unacknowledged
        for good, since a message the peer reported received is not sent again."""
        if settled <= 0 or not self._unacked:
            return
        done = []
        for seq in self._unacked:
            if seq > settled:
                break
            done.append(seq)
        if done:
            self.on_ack(done)

    def _check_acknowledged(self) -> None:
        if not self._unacked and self._acknowledged is not None:
            self._acknowledged.set()
            self._acknowledged = None

    async def wait_acknowledged(self) -> None:
        """Return once the peer has acknowledged every data message sent so far."""
        if self._unacked:
            if self._acknowledged is None:
                self._acknowledged = anyio.Event()
            await self._acknowledged.wait()

    def on_nack(self, seq: int) -> None:
        pending = self._unacked.get(seq)
        if pending is not None:
            pending.nacked = True  # retried after resend_interval, received mark or not
            pending.sent_at = anyio.current_time()

    def on_grant(self, target: str, amount: int) -> None:
        credit = self._credits.get(target)
        if credit is None:
            credit = self._credits[target] = _Credit()
            credit.last_used = anyio.current_time()
        credit.balance += amount
        credit.granted_before = True
        credit.requested_at = None
        credit.wake()

    def on_denied(self, target: str) -> None:
        """The peer has no such actor. If it had one before, it is being restarted (or
        its node was): keep asking, every resend interval, and keep senders waiting."""
        credit = self._credits.get(target)
        if credit is not None and not credit.granted_before:
            credit.denied = True
            credit.wake()

    # -- inbound data ---------------------------------------------------------------

    def seen(self, seq: int) -> Seen:
        if seq <= self._recv_hwm or seq in self._recv_above:
            self._duplicates += 1
            return Seen.PENDING if seq in self._recv_pending else Seen.SETTLED
        return Seen.NEW

    def mark_received(self, seq: int) -> None:
        self._received += 1
        self._recv_pending.add(seq)
        self._recv_above.add(seq)
        self._advance_hwm()

    def _advance_hwm(self) -> None:
        above = self._recv_above
        while self._recv_hwm + 1 in above:
            self._recv_hwm += 1
            above.discard(self._recv_hwm)

    def restore_settled(self, seqs: Iterable[int]) -> None:
        """Treat these sequence numbers of the current peer incarnation as handled
        (by an earlier incarnation of *this* node, which recorded them durably)."""
        self._recv_above.update(s for s in seqs if s > self._recv_hwm)
        self._advance_hwm()

    def settle(self, seq: int, incarnation: int) -> None:
        """Acknowledge a handled message, unless it came from an earlier incarnation."""
        if incarnation != self.peer_incarnation:
            return
        self._recv_pending.discard(seq)
        self._acks.append(seq)
        self.wake()

    def ack_again(self, seq: int) -> None:
        self._acks.append(seq)
        self.wake()

    def nack(self, seq: int, reason: str) -> None:
        self._nacks.append((seq, reason))
        self.wake()

    def queue_reply(self, data: bytes, frames: Sequence[Buffer]) -> None:
        self._replies.append((data, frames))
        self.flush_nowait()

    def queue_grant(self, target: str, amount: int) -> None:
        self._grants[target] = self._grants.get(target, 0) + amount
        self.wake()

    def queue_denied(self, target: str) -> None:
        self._denied.add(target)
        self.wake()

    # -- sending batches ------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    @property
    def settled(self) -> int:
        """Every data sequence number of the peer up to this one is handled."""
        if self._recv_pending:
            return min(min(self._recv_pending) - 1, self._recv_hwm)
        return self._recv_hwm

    @property
    def base(self) -> int:
        """Every data sequence number up to this one is settled."""
        for seq in self._unacked:
            return seq - 1
        return self._next_seq - 1

    def _has_output(self) -> bool:
        return bool(
            self._outbox
            or self._replies
            or self._acks
            or self._nacks
            or self._requests
            or self._grants
            or self._returns
            or self._denied
        )

    def _control_items(self) -> list[tuple[bytes, Sequence[Buffer]]]:
        items: list[tuple[bytes, Sequence[Buffer]]] = []
        for start in range(0, len(self._acks), _MAX_ACKS_PER_ITEM):
            items.append((encode_item(Ack(self._acks[start : start + _MAX_ACKS_PER_ITEM])), ()))
        items.extend((encode_item(Nack(seq, reason)), ()) for seq, reason in self._nacks)
        items.extend(
            (encode_item(CreditRequest(t, self._outstanding(t))), ()) for t in self._requests
        )
        items.extend((encode_item(CreditGrant(t, n)), ()) for t, n in self._grants.items())
        items.extend((encode_item(CreditReturn(t, n)), ()) for t, n in self._returns.items())
        items.extend((encode_item(CreditDenied(t)), ()) for t in self._denied)
        return items

    def _outstanding(self, target: str) -> int:
        credit = self._credits.get(target)
        return 0 if credit is None else credit.outstanding

    def _clear_control(self) -> None:
        self._acks.clear()
        self._nacks.clear()
        self._requests.clear()
        self._grants.clear()
        self._returns.clear()
        self._denied.clear()

    def answer_on(self, connection: Connection) -> None:
        """Send a header-only batch over ``connection`` (not this link's own)."""
        frames = encode_batch(
            self.local,
            self.incarnation,
            self.peer_incarnation,
            self.base,
            self._recv_hwm,
            self.settled,
            [],
        )
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
            connection.send_nowait(frames)

    def flush_nowait(self, *, heartbeat: bool = False) -> bool:
        """Send everything queued, in batches; False if the transport could not take it
        all now (the rest stays queued). ``heartbeat`` sends a batch even if empty."""
        connection = self.connection
        if connection is None:
            return not self._has_output()
        limit_items, limit_bytes = self.config.batch_items, self.config.batch_bytes
        while heartbeat or self._has_output():
            heartbeat = False
            items = self._control_items()
            size = 0
            replies: list[tuple[bytes, Sequence[Buffer]]] = []
            while self._replies and len(items) < limit_items and size < limit_bytes:
                reply = self._replies.popleft()
                replies.append(reply)
                items.append(reply)
                size += len(reply[0]) + sum(memoryview(f).nbytes for f in reply[1])
            taken: list[_Pending] = []
            while self._outbox and len(items) < limit_items and size < limit_bytes:
                pending = self._outbox.popleft()
                taken.append(pending)
                if pending.seq in self._unacked:
                    items.append((pending.data, pending.frames))
                    size += pending.nbytes
            frames = encode_batch(
                self.local,
                self.incarnation,
                self.peer_incarnation,
                self.base,
                self._recv_hwm,
                self.settled,
                items,
            )
            try:
                connection.send_nowait(frames)
            except (anyio.WouldBlock, anyio.BrokenResourceError) as exc:
                self._outbox.extendleft(reversed(taken))
                self._replies.extendleft(reversed(replies))
                self._blocked += 1
                if isinstance(exc, anyio.BrokenResourceError):
                    self.connection = None
                    self._connected = anyio.Event()
                return False
            now = anyio.current_time()
            for pending in taken:
                pending.queued = False
                pending.sent_at = now
            self._clear_control()
            self.last_sent = now
            self._batches_sent += 1
        self._outbox_bytes = 0
        return True

    async def run_flusher(self) -> None:
        """Send what was queued whenever woken; the one checkpoint before sending lets
        every task that is ready to run add its messages to the same batch."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await anyio.lowlevel.checkpoint()
            while not self.flush_nowait():
                if self.connection is None:
                    await self._connected.wait()
                else:
                    with anyio.move_on_after(self.config.heartbeat_interval):
                        await self.connection.wait_writable()

    # -- periodic work --------------------------------------------------------------

    def tick(self, now: float) -> bool:
        """Retransmit, re-ask, return idle credit, send a heartbeat if due; True if the
        peer just went silent for longer than the heartbeat timeout."""
        config = self.config
        went_down = False
        if self.state is not LinkState.DOWN and now - self.last_received > config.heartbeat_timeout:
            self.mark_down(now)
            went_down = True
        for pending in self._unacked.values():
            if (
                not pending.queued
                and (pending.nacked or pending.seq > self._peer_received)
                and now - pending.sent_at >= config.resend_interval
            ):
                pending.queued = True
                pending.nacked = False
                self._outbox.append(pending)
                self._resent += 1
        for target, credit in self._credits.items():
            if (
                credit.requested_at is not None
                and now - credit.requested_at >= config.resend_interval
            ):
                credit.requested_at = now
                self._requests.add(target)
            elif (
                credit.balance > 0
                and credit.waiter is None
                and now - credit.last_used >= config.credit_idle
            ):
                self._returns[target] = self._returns.get(target, 0) + credit.balance
                credit.balance = 0
        if self._has_output():
            self.wake()
        elif now - self.last_sent >= config.heartbeat_interval:
            self.flush_nowait(heartbeat=True)
        return went_down

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(
            peer=self.peer,
            state=self.state.value,
            peer_incarnation=self.peer_incarnation,
            unacked=len(self._unacked),
            outbox=len(self._outbox),
            credit={t: c.balance for t, c in self._credits.items()},
            sent=self._sent,
            received=self._received,
            resent=self._resent,
            duplicates=self._duplicates,
            batches_sent=self._batches_sent,
            batches_received=self._batches_received,
            blocked=self._blocked,
        )

    def __repr__(self) -> str:
        credit = sum(c.balance for c in self._credits.values())
        return (
            f"<Link {self.local}→{self.peer} {self.state.value} "
            f"[unacked {len(self._unacked)} | outbox {len(self._outbox)} | credit {credit} | "
            f"sent {self._sent} received {self._received} resent {self._resent} "
            f"duplicates {self._duplicates}]>"
        )
