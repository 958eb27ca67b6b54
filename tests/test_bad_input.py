"""Bad input off the wire is rejected one frame or one message at a time: each
rejection is counted under its reason and logged, and the node keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest
import structlog
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import Node, NodeConfig, open_node
from runtime._wire import PROTOCOL, DataOut, Header
from tests.sample_actors import Add, Counter, Get

pytestmark = pytest.mark.anyio
LIMIT = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


class Rig:
    """A head with a counter, a well-behaved worker, and a raw socket for garbage."""

    def __init__(self, head: Node, worker: Node, raw: zmq.Socket[bytes]) -> None:
        self.head, self.worker, self.raw = head, worker, raw

    def send(self, *frames: bytes) -> None:
        self.raw.send_multipart(list(frames))

    async def still_serves(self) -> None:
        counter = await self.worker.lookup("counter", timeout=5)
        await self.worker.send(counter, Add(1))
        assert (await self.worker.call(counter, Get(), timeout=5)).value >= 1

    async def wait_rejected(self, reason: str, count: int = 1) -> None:
        with anyio.fail_after(5):
            # The node publishes rejections as counters, so the test polls them.
            while self.head.statistics().rejected.get(reason, 0) < count:  # noqa: ASYNC110
                await anyio.sleep(0.01)


@asynccontextmanager
async def open_rig() -> AsyncIterator[Rig]:
    config = NodeConfig(max_frame_bytes=LIMIT)
    async with (
        open_node("head", config=config) as head,
        open_node("worker", head=head.address, config=config) as worker,
    ):
        await head.spawn("counter", Counter)
        context = zmq.Context()
        raw = context.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.ROUTING_ID, b"fuzzer")
        raw.connect(head.address)
        try:
            yield Rig(head, worker, raw)
        finally:
            context.destroy(linger=0)


def header(
    items: list[tuple[int, bytes]], *, sender: str = "fuzzer", protocol: int = PROTOCOL
) -> bytes:
    return msgspec.msgpack.encode(
        Header(protocol, sender, 7, 0, 0, 0, [(n, msgspec.Raw(item)) for n, item in items])
    )


def data(target: str, payload: Any, seq: int = 1) -> bytes:
    return msgspec.msgpack.encode(DataOut(seq, target, "fuzz", 0, 0, payload))


CASES: list[tuple[str, Callable[[], list[bytes]], str]] = [
    ("random bytes", lambda: [b"\xc1\xff\x00garbage"], "bad_header"),
    (
        "truncated: a frame announced but missing",
        lambda: [header([(1, data("counter", Add(1)))])],
        "frame_count",
    ),
    ("oversized frame", lambda: [header([]), b"\x00" * (LIMIT + 1)], "oversized"),
    ("another protocol version", lambda: [header([], protocol=99)], "protocol"),
    (
        "a sender other than the connection's identity",
        lambda: [header([], sender="worker")],
        "bad_sender",
    ),
    (
        "an item of an unknown kind",
        lambda: [header([(0, msgspec.msgpack.encode([99, 1]))])],
        "bad_item",
    ),
    (
        "a message for an unknown actor",
        lambda: [header([(0, data("nobody", Add(1)))])],
        "unknown_actor",
    ),
    (
        "an unknown message type",
        lambda: [header([(0, data("counter", {"type": "Drop"}))])],
        "bad_payload",
    ),
    (
        "a field of the wrong type",
        lambda: [header([(0, data("counter", {"type": "Add", "n": "x"}))])],
        "bad_payload",
    ),
]


@pytest.mark.parametrize(("case", "frames", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_each_kind_of_bad_frame_is_named_counted_and_survived(
    case: str, frames: Callable[[], list[bytes]], reason: str
) -> None:
    async with open_rig() as rig:
        await rig.still_serves()
        with structlog.testing.capture_logs() as logs:
            rig.send(*frames())
            await rig.wait_rejected(reason)
        await rig.still_serves()
        rejected = [log for log in logs if log["event"] == "rejected"]
        assert rejected and rejected[0]["reason"] == reason
        assert rejected[0]["detail"]


async def test_data_with_a_valid_envelope_and_invalid_payload_names_the_field() -> None:
    async with open_rig() as rig:
        with structlog.testing.capture_logs() as logs:
            rig.send(header([(0, data("counter", {"type": "Add", "n": "x"}))]))
            await rig.wait_rejected("bad_payload")
        detail = next(log["detail"] for log in logs if log["event"] == "rejected")
        assert detail == "Expected `int`, got `str` - at `$.n`"
        assert rig.head.actor_statistics("counter").rejected == 1


int64 = st.integers(-(2**63), 2**63 - 1)
frames_strategy = st.one_of(
    st.lists(st.binary(max_size=512), min_size=1, max_size=4),
    st.builds(
        lambda sender, inc, base, items, extra: [
            msgspec.msgpack.encode([PROTOCOL, sender, inc, 0, base, 0, items]),
            *extra,
        ],
        st.sampled_from(["fuzzer", "", "head"]),
        int64,
        int64,
        st.lists(
            st.tuples(
                st.integers(-2, 3),
                st.one_of(
                    st.binary(max_size=64).map(msgspec.Raw),
                    st.builds(
                        lambda seq, target, payload: msgspec.Raw(
                            msgspec.msgpack.encode([1, seq, target, "fuzz", 0, 0, payload])
                        ),
                        st.integers(-5, 2**40),
                        st.sampled_from(["counter", "nobody", ""]),
                        st.one_of(
                            st.none(),
                            int64,
                            st.text(max_size=8),
                            st.fixed_dictionaries(
                                {
                                    "type": st.sampled_from(["Add", "Get", "X"]),
                                    "n": st.one_of(int64, st.text()),
                                }
                            ),
                        ),
                    ),
                    st.builds(
                        lambda tag, rest: msgspec.Raw(msgspec.msgpack.encode([tag, *rest])),
                        st.integers(0, 9),
                        st.lists(
                            st.one_of(int64, st.text(max_size=8), st.lists(int64, max_size=3)),
                            max_size=4,
                        ),
                    ),
                ),
            ),
            max_size=4,
        ),
        st.lists(st.binary(max_size=64), max_size=3),
    ),
)


async def test_hypothesis_generated_frames_never_stop_the_node() -> None:
    async with open_rig() as rig:
        examples = 0

        @settings(
            max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(frames=frames_strategy)
        def fuzz(frames: list[bytes]) -> None:
            nonlocal examples
            examples += 1
            rig.send(*frames)
            anyio.from_thread.run(rig.still_serves)

        await anyio.to_thread.run_sync(fuzz)
        stats = rig.head.statistics()
        assert examples == 300
        assert sum(stats.rejected.values()) >= 100, stats.rejected
        assert rig.head.actor_statistics("counter").running
