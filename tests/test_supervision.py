"""Supervision, redelivery to restarted actors and heartbeat failure detection, in
virtual time (pytest-trio's autojump_clock) over the in-memory transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import trio
from anyio.abc import TaskGroup

from runtime import (
    Actor,
    ActorRef,
    Node,
    NodeConfig,
    PeerUnavailable,
    SupervisionEscalated,
    open_node,
)
from runtime.testing import Capture, MemoryNetwork, open_cluster
from tests.sample_actors import Add, Count, Counter, Get, Hang, Record


class Poison(Record, frozen=True):
    """Crashes the actor that handles it for the first ``times`` attempts."""

    times: int = 1


class Member(Actor):
    """Counts starts across restarts; crashes on Poison while it has attempts left."""

    inbox = Record | Poison | Get
    starts: dict[str, int] = {}
    handled: list[tuple[str, int]] = []
    attempts: dict[int, int] = {}
    changed = anyio.Event()

    async def on_start(self) -> None:
        Member.starts[self.name] = Member.starts.get(self.name, 0) + 1

    async def handle(self, message: Record | Poison | Get) -> Count | None:
        if isinstance(message, Get):
            return Count(Member.starts[self.name])
        if isinstance(message, Poison):
            seen = Member.attempts[message.key] = Member.attempts.get(message.key, 0) + 1
            if seen <= message.times:
                raise RuntimeError(f"poison {message.key}, attempt {seen}")
        Member.handled.append((self.name, message.key))
        Member.changed.set()
        return None


async def wait_handled(entry: tuple[str, int]) -> None:
    while entry not in Member.handled:
        Member.changed = anyio.Event()
        await Member.changed.wait()


@pytest.fixture(autouse=True)
def _reset_members() -> None:
    Member.starts, Member.handled, Member.attempts = {}, [], {}


async def spawn_team(node, strategy: str, intensity: int = 3):  # type: ignore[no-untyped-def]
    team = await node.start_supervisor("team", strategy=strategy, intensity=intensity, period=5)
    refs = [await node.spawn(name, Member, supervisor=team) for name in ("a", "b", "c")]
    return team, refs


@pytest.mark.trio
async def test_crashed_actor_gets_its_message_again_and_keeps_its_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_cluster("head") as (head,):
        _, (a, _, _) = await spawn_team(head, "one_for_one")
        await head.send(a, Record(1))
        await head.send(a, Poison(2, times=1))
        await head.send(a, Record(3))
        await wait_handled(("a", 3))
        assert Member.handled == [("a", 1), ("a", 2), ("a", 3)]
        assert Member.attempts == {2: 2}
        assert Member.starts == {"a": 2, "b": 1, "c": 1}
        assert head.actor_statistics("a").restarts == 1


@pytest.mark.trio
@pytest.mark.parametrize(
    ("strategy", "restarted"),
    [("one_for_one", {"b"}), ("one_for_all", {"a", "b", "c"}), ("rest_for_one", {"b", "c"})],
)
async def test_strategies_restart_the_right_children(
    strategy: str, restarted: set[str], autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster("head") as (head,):
        _, (_, b, _) = await spawn_team(head, strategy)
        await head.send(b, Poison(7, times=1))
        await wait_handled(("b", 7))
        # b runs again as soon as it is restarted; the rest of the team after it.
        await trio.testing.wait_all_tasks_blocked()
        assert {name for name, starts in Member.starts.items() if starts == 2} == restarted
        assert {name for name, starts in Member.starts.items() if starts == 1} == (
            {"a", "b", "c"} - restarted
        )


@pytest.mark.trio
async def test_a_message_that_keeps_crashing_is_dead_lettered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = NodeConfig(max_attempts=3)
    async with open_cluster("head", config=config) as (head,):
        _, (a, _, _) = await spawn_team(head, "one_for_one", intensity=5)
        await head.send(a, Poison(1, times=100))
        await head.send(a, Record(2))
        await wait_handled(("a", 2))
        stats = head.actor_statistics("a")
        assert (stats.dead_lettered, stats.restarts, Member.attempts[1]) == (1, 3, 3)


@pytest.mark.trio
async def test_too_many_restarts_escalate_to_the_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Fragile(Actor):
        inbox = Record
        starts = 0

        async def on_start(self) -> None:
            Fragile.starts += 1
            if Fragile.starts > 1:
                raise RuntimeError("cannot start again")

        async def handle(self, message: Record) -> None:
            raise RuntimeError("crash")

    with pytest.raises(SupervisionEscalated, match="exceeded 10 restarts"):
        async with open_cluster("head") as (head,):
            team = await head.start_supervisor("team", intensity=1, period=60)
            fragile = await head.spawn("fragile", Fragile, supervisor=team)
            await head.send(fragile, Record(1))
            await anyio.sleep_forever()


@asynccontextmanager
async def head_and_worker() -> AsyncIterator[tuple[Node, ActorRef, anyio.CancelScope, TaskGroup]]:
    """A head and a worker node hosting a Counter, heartbeats every 0.5 s and a 3 s
    timeout; yields the head, the counter, the scope whose cancelling silences the
    worker, and a task group to run things beside the test."""
    config = NodeConfig(heartbeat_interval=0.5, heartbeat_timeout=3.0, shutdown_timeout=0.1)
    network = MemoryNetwork()
    async with open_node("head", listen="mem://head", config=config, transport=network) as head:
        worker_scope = anyio.CancelScope()
        started = anyio.Event()

        async def worker() -> None:
            with worker_scope:
                async with open_node(
                    "worker",
                    listen="mem://worker",
                    head="mem://head",
                    config=config,
                    transport=network,
                ) as node:
                    await node.spawn("counter", Counter)
                    started.set()
                    await anyio.sleep_forever()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(worker)
            await started.wait()
            counter = await head.lookup("counter", timeout=1)
            yield head, counter, worker_scope, tasks
            worker_scope.cancel()


@pytest.mark.trio
async def test_a_silent_node_is_detected_within_the_heartbeat_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with head_and_worker() as (head, counter, worker_scope, tasks):
        await head.send(counter, Add(1))
        assert await head.call(counter, Get(), timeout=1) == Count(1)

        async def stop_worker_soon() -> None:
            await anyio.sleep(1.0)
            worker_scope.cancel()

        tasks.start_soon(stop_worker_soon)
        start = anyio.current_time()
        with pytest.raises(PeerUnavailable, match="'worker' stopped answering"):
            await head.call(counter, Hang(), timeout=60)
        silent_for = anyio.current_time() - start - 1.0
        # The last heartbeat left at most one interval before the stop; ticks run
        # every half interval.
        assert 3.0 - 0.5 <= silent_for <= 3.0 + 0.25
        assert head.link_statistics("worker").state == "down"


@pytest.mark.trio
async def test_capture_records_what_an_actor_sent(autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster("head", "worker") as (head, worker):
        capture = Capture(Record)
        sink = await head.spawn("sink", capture.factory)
        for key in range(3):
            await worker.send(sink, Record(key))
        assert await capture.wait_for(3) == [Record(0), Record(1), Record(2)]


@pytest.mark.trio
async def test_a_call_waiting_for_credit_fails_when_its_peer_goes_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with head_and_worker() as (head, counter, worker_scope, tasks):

        async def hang() -> None:
            with pytest.raises(PeerUnavailable):
                await head.call(counter, Hang(), timeout=60)

        tasks.start_soon(hang)  # the counter is busy from now on
        sent = 0
        while True:  # until a send waits a second: the counter's credit is used up
            with anyio.move_on_after(1.0) as waited:
                await head.send(counter, Add(1))
            if waited.cancelled_caught:
                break
            sent += 1
        assert sent > 0
        worker_scope.cancel()
        start = anyio.current_time()
        with pytest.raises(PeerUnavailable, match="'worker' went down while a call"):
            await head.call(counter, Get(), timeout=60)
        assert anyio.current_time() - start <= 3.0 + 0.25
