"""The runtime's contract, checked over every transport (memory, ipc, tcp) and both
event-loop backends (trio, asyncio)."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from runtime import (
    ActorNotFound,
    ActorRef,
    Blob,
    CallTimeout,
    MessageRejected,
    NodeConfig,
    PeerUnavailable,
    RemoteError,
)
from runtime.testing import Capture
from tests.conftest import TRANSPORTS, open_pair
from tests.sample_actors import (
    Add,
    Count,
    Counter,
    Echo,
    Echoed,
    Fail,
    Get,
    Hang,
    Mirror,
    Record,
    Unexpected,
)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", TRANSPORTS)]


async def test_sends_arrive_once_and_in_order(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        capture = Capture(Record)
        await head.spawn("sink", capture.factory)
        sink = await worker.lookup("sink", timeout=5)
        for key in range(500):
            await worker.send(sink, Record(key))
        with anyio.fail_after(10):
            received = await capture.wait_for(500)
            await worker.wait_acknowledged()
        assert [r.key for r in received] == list(range(500))


async def test_call_returns_the_typed_reply(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        for _ in range(3):
            await worker.send(counter, Add(2))
        assert await worker.call(counter, Get(), timeout=5) == Count(6)


async def test_handler_error_is_raised_in_the_caller_and_the_actor_carries_on(
    transport: str, tmp_path: Path
) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        await worker.send(counter, Add(1))
        with pytest.raises(RemoteError) as caught:
            await worker.call(counter, Fail("no such key 'x'"), timeout=5)
        assert caught.value.type_name == "ValueError"
        assert caught.value.actor == "counter"
        assert "no such key 'x'" in str(caught.value)
        assert "raise ValueError(why)" in caught.value.traceback
        assert await worker.call(counter, Get(), timeout=5) == Count(1)


async def test_call_without_reply_times_out(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        with pytest.raises(CallTimeout, match=r"Hang to counter@head got no reply within 0.2 s"):
            await worker.call(counter, Hang(), timeout=0.2)
        assert worker.statistics().calls_pending == 0


async def test_lookup_waits_for_a_name_to_be_registered(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        async with anyio.create_task_group() as tasks:
            found: list[ActorRef] = []

            async def look() -> None:
                found.append(await worker.lookup("late", timeout=5))

            tasks.start_soon(look)
            await anyio.sleep(0.05)
            await head.spawn("late", Counter)
        assert found == [ActorRef("head", "late")]
        with pytest.raises(ActorNotFound, match="no actor is registered as 'missing'"):
            await worker.lookup("missing", timeout=0)


async def test_unknown_actor_and_unaccepted_message_fail_that_message_only(
    transport: str, tmp_path: Path
) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        with pytest.raises(ActorNotFound, match="no actor named 'nobody' on node 'head'"):
            await worker.call(ActorRef("head", "nobody"), Get(), timeout=5)
        with pytest.raises(MessageRejected, match=r"Invalid value 'Unexpected'"):
            await worker.call(counter, Unexpected(), timeout=5)
        with pytest.raises(PeerUnavailable, match="no address is known for node 'elsewhere'"):
            await worker.call(ActorRef("elsewhere", "counter"), Get(), timeout=5)
        assert await worker.call(counter, Get(), timeout=5) == Count(0)
        rejected = head.statistics().rejected
        assert rejected == {"bad_payload": 1}
        assert head.actor_statistics("counter").rejected == 1


async def test_arrays_and_blobs_travel_as_frames(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("mirror", Mirror)
        mirror = await worker.lookup("mirror", timeout=5)
        array = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
        blob = Blob(bytes(range(256)) * 4096)
        echoed = await worker.call(mirror, Echo(array, blob, "tokens"), timeout=5)
        assert echoed.text == "tokens"
        assert echoed.array.dtype == np.float32 and echoed.array.shape == (512, 512)
        np.testing.assert_array_equal(echoed.array, array)
        assert not echoed.array.flags.writeable
        assert bytes(echoed.blob) == bytes(blob)


async def test_small_messages_are_coalesced_into_batches(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        capture = Capture(Record, mailbox_size=4096)
        await head.spawn("sink", capture.factory)
        sink = await worker.lookup("sink", timeout=5)
        before = worker.link_statistics("head").batches_sent
        for key in range(2000):
            await worker.send(sink, Record(key))
        with anyio.fail_after(10):
            await capture.wait_for(2000)
            await worker.wait_acknowledged()
        batches = worker.link_statistics("head").batches_sent - before
        assert batches <= 2000 / 8, f"2000 messages took {batches} batches"


async def test_sender_waits_for_credit_when_the_receiver_is_full(
    transport: str, tmp_path: Path
) -> None:
    config = NodeConfig(shutdown_timeout=0.2)  # the hung call is never acknowledged
    async with open_pair(transport, tmp_path, config) as (head, worker):
        await head.spawn("counter", Counter)  # mailbox of 16
        counter = await worker.lookup("counter", timeout=5)
        await worker.send(counter, Add(1))
        blocker = anyio.Event()
        sent = 0

        async def produce() -> None:
            nonlocal sent
            with anyio.move_on_after(0.5):
                while True:
                    await worker.send(counter, Add(1))
                    sent += 1
            blocker.set()

        async def hang() -> None:
            await worker.call(counter, Hang(), timeout=10)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(hang)
            await anyio.sleep(0.05)
            tasks.start_soon(produce)
            await blocker.wait()
            stats = head.actor_statistics("counter")
            assert stats.mailbox + stats.in_flight <= stats.capacity
            assert sent <= stats.capacity
            assert worker.link_statistics("head").unacked <= stats.capacity + 1
            tasks.cancel_scope.cancel()


async def test_idle_workers_hold_no_handled_message(transport: str, tmp_path: Path) -> None:
    """Each worker of a concurrent actor lets go of the message it handled: an engine
    has 1024 workers, and each kept a bucket of weights alive while it waited."""
    import gc

    from runtime import Actor

    class Pool(Actor):
        inbox = Echo
        concurrency = 8

        async def handle(self, message: Echo) -> Echoed:
            await anyio.sleep(0.01)
            return Echoed(message.array, message.blob, "")

    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("pool", Pool)
        pool = await worker.lookup("pool", timeout=5)
        async with anyio.create_task_group() as tasks:
            for _ in range(8):
                tasks.start_soon(
                    lambda: worker.call(pool, Echo(np.zeros(4), Blob(b"x")), timeout=5)
                )
        gc.collect()
        assert not [o for o in gc.get_objects() if type(o) is Echo]


async def test_concurrency_limit_bounds_messages_in_flight(transport: str, tmp_path: Path) -> None:
    from runtime import Actor

    class Pool(Actor):
        inbox = Hang
        concurrency = 3
        mailbox_size = 16

        def __init__(self) -> None:
            self.active = 0
            self.peak = 0

        async def handle(self, message: Hang) -> Count:
            self.active += 1
            self.peak = max(self.peak, self.active)
            await anyio.sleep(0.05)
            self.active -= 1
            return Count(self.peak)

    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("pool", Pool)
        pool = await worker.lookup("pool", timeout=5)
        peaks: list[int] = []

        async def one() -> None:
            peaks.append((await worker.call(pool, Hang(), timeout=5)).value)

        async with anyio.create_task_group() as tasks:
            for _ in range(9):
                tasks.start_soon(one)
        assert max(peaks) == 3


async def test_state_shows_in_repr_and_statistics(transport: str, tmp_path: Path) -> None:
    async with open_pair(transport, tmp_path) as (head, worker):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        await worker.call(counter, Get(), timeout=5)
        await worker.wait_acknowledged()
        cell = head._cells["counter"]
        assert repr(cell) == (
            "<Actor counter@head Counter running [mailbox 0/16 | in-flight 0/1 | granted 3 | "
            "handled 1 failed 0 rejected 0 restarts 0]>"
        )
        link = repr(worker._links["head"])
        assert link.startswith("<Link worker→head up [unacked 0 | outbox 0 |")
        assert repr(head).startswith(f"<Node head head at {head.address} [actors 2 | links 1/1 up")
        stats = worker.statistics()
        assert [s.peer for s in stats.links] == ["head"]
        assert stats.links[0].sent >= 2
