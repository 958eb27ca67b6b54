"""A link's delivery bookkeeping, driven by hand between two links with the transport
replaced by a list, so a test decides which batches arrive."""

from __future__ import annotations

import anyio
import pytest

from runtime import NodeConfig
from runtime._link import Link
from runtime._transport import Buffer, Connection
from runtime._wire import Data, DataOut, decode_header, decode_item, encode_item

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


class Captured(Connection):
    """Keeps every batch handed to it; delivering one is the test's choice."""

    def __init__(self) -> None:
        self.batches: list[list[Buffer]] = []

    def send_nowait(self, frames: list[Buffer]) -> None:
        self.batches.append(frames)

    async def wait_writable(self) -> None:
        return None


def linked_pair() -> tuple[Link, Captured, Link, Captured]:
    config = NodeConfig()
    now = anyio.current_time()
    a, b = Link("a", 11, "b", config, now), Link("b", 22, "a", config, now)
    a_out, b_out = Captured(), Captured()
    a.attach(a_out, dialed=True)
    b.attach(b_out, dialed=False)
    return a, a_out, b, b_out


def send(link: Link, target: str) -> None:
    seq = link.next_seq()
    link.enqueue(
        seq, target, encode_item(DataOut(seq, target, "x", 0, 0, None)), [], 0, urgent=True
    )


def deliver(frames: list[Buffer], to: Link) -> list[Data]:
    """Take in a batch's header and return the data items in it (not yet handled)."""
    header = decode_header(frames, max_frame_bytes=1 << 20)
    to.on_header(header, anyio.current_time())
    items = [decode_item(raw) for _, raw in header.items]
    return [item for item in items if isinstance(item, Data)]


async def test_a_lost_ack_is_made_good_by_the_settled_mark_of_a_later_batch() -> None:
    a, a_out, b, b_out = linked_pair()
    b.flush_nowait(heartbeat=True)
    deliver(b_out.batches.pop(), to=a)  # a learns b's incarnation

    send(a, "ledger")
    (item,) = deliver(a_out.batches.pop(), to=b)
    b.mark_received(item.seq)
    b.settle(item.seq, b.peer_incarnation)
    b.flush_nowait()
    b_out.batches.pop()  # the batch carrying the ack is lost with its connection
    assert a.unacked == 1

    b.flush_nowait(heartbeat=True)
    deliver(b_out.batches.pop(), to=a)
    assert a.unacked == 0


async def test_the_settled_mark_stops_at_the_first_message_still_being_handled() -> None:
    a, a_out, b, b_out = linked_pair()
    b.flush_nowait(heartbeat=True)
    deliver(b_out.batches.pop(), to=a)
    a.flush_nowait(heartbeat=True)
    deliver(a_out.batches.pop(), to=b)  # b learns a's incarnation

    for _ in range(3):
        send(a, "t")
        (item,) = deliver(a_out.batches.pop(), to=b)
        b.mark_received(item.seq)
    b.settle(1, b.peer_incarnation)
    b.settle(3, b.peer_incarnation)  # 2 is still in its actor's hands
    assert b.settled == 1
    b.flush_nowait()
    b_out.batches.pop()  # lost: the acks of 1 and 3

    b.flush_nowait(heartbeat=True)
    deliver(b_out.batches.pop(), to=a)
    assert a.unacked == 2  # 1 settled by the mark; 3 waits behind 2

    b.settle(2, b.peer_incarnation)
    b.flush_nowait()
    b_out.batches.pop()  # lost too
    b.flush_nowait(heartbeat=True)
    deliver(b_out.batches.pop(), to=a)
    assert a.unacked == 0
