"""Bad input off the wire is rejected one frame or one message at a time: each
rejection is counted under its reason and logged, and the node keeps serving."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import msgspec
import pytest
import structlog

from runtime import RemoteError
from tests.sample_actors import Add, Counter, Get
from tests.wire_fuzz import LIMIT, data, fuzz, header, open_rig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


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


async def test_a_replayed_sequence_number_is_delivered_once() -> None:
    async with open_rig() as rig:
        for _ in range(3):
            rig.send(header([(0, data("counter", Add(5), seq=1))]))

        def duplicates() -> int:
            links = rig.head.statistics().links
            return sum(link.duplicates for link in links if link.peer == "fuzzer")

        with anyio.fail_after(5):
            # The node counts duplicates in its link statistics; the test polls them.
            while duplicates() < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        counter = await rig.head.lookup("counter", timeout=5)
        assert (await rig.head.call(counter, Get(), timeout=5)).value == 5
        await rig.still_serves()
        assert duplicates() == 2


async def test_hypothesis_generated_frames_never_stop_the_node() -> None:
    async with open_rig() as rig:
        report = await fuzz(rig, 1000, check_every=50)
    assert report.cases == 1000 and report.checks == 21
    assert sum(report.rejected.values()) >= 300, report.rejected
    assert {"bad_header", "bad_item", "unknown_actor", "bad_payload"} <= set(report.rejected)


async def test_a_reply_too_large_to_encode_fails_the_call_not_the_node() -> None:
    """The fuzzer found this: valid sends pushed a counter past what msgpack can hold,
    and encoding the reply to a remote Get raised OverflowError inside the node."""
    async with open_rig() as rig:
        counter = await rig.worker.lookup("counter", timeout=5)
        for _ in range(5):
            await rig.worker.send(counter, Add(2**62))
        with pytest.raises(RemoteError, match="the reply could not be encoded"):
            await rig.worker.call(counter, Get(), timeout=5)
        await rig.still_serves()


async def test_a_message_that_cannot_be_encoded_fails_its_send_and_the_link_goes_on() -> None:
    async with open_rig() as rig:
        counter = await rig.worker.lookup("counter", timeout=5)
        for _ in range(2 * Counter.mailbox_size):
            with pytest.raises(OverflowError):
                await rig.worker.send(counter, Add(2**64))
        await rig.worker.send(counter, Add(3))
        assert (await rig.worker.call(counter, Get(), timeout=5)).value == 3
        await rig.still_serves()
