"""Wire fuzzing: hypothesis-generated frames thrown at a live node over TCP.

A raw DEALER socket sends what the strategy makes (random bytes; envelopes of every
shape with items of known and unknown kinds; data for real, unknown and empty actor
names with payloads of the wrong type; sequence numbers that repeat) while a
well-behaved worker node keeps talking to an actor on the same head. ``fuzz`` checks
the head still serves every ``check_every`` cases and at the end; the tests run it
briefly, and the command line runs it long and prints a report:

    .venv/bin/python -m tests.wire_fuzz --cases 100000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import msgspec
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import Node, NodeConfig, configure_logging, open_node
from runtime._wire import PROTOCOL, DataOut, Header
from tests.sample_actors import Add, Counter, Get

LIMIT = 1 << 20


class Rig:
    """A head with a ``counter`` the raw socket aims at and a ``canary`` it never
    names, a well-behaved worker, and the raw socket for garbage."""

    def __init__(self, head: Node, worker: Node, raw: zmq.Socket[bytes]) -> None:
        self.head, self.worker, self.raw = head, worker, raw
        self.checks = 0

    def send(self, *frames: bytes) -> None:
        self.raw.send_multipart(list(frames))

    async def still_serves(self) -> None:
        """The worker's every message to the canary arrived, this one included."""
        canary = await self.worker.lookup("canary", timeout=5)
        await self.worker.send(canary, Add(1))
        self.checks += 1
        assert (await self.worker.call(canary, Get(), timeout=5)).value == self.checks

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
        await head.spawn("canary", Counter)
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
        Header(protocol, sender, 7, 0, 0, 0, 0, [(n, msgspec.Raw(item)) for n, item in items])
    )


def data(target: str, payload: Any, seq: int = 1) -> bytes:
    return msgspec.msgpack.encode(DataOut(seq, target, "fuzz", 0, 0, payload))


int64 = st.integers(-(2**63), 2**63 - 1)
payloads = st.one_of(
    st.none(),
    int64,
    st.text(max_size=8),
    st.builds(Add, st.integers(-(2**31), 2**31)),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["Add", "Get", "X"]), "n": st.one_of(int64, st.text())}
    ),
)
items = st.one_of(
    st.binary(max_size=64).map(msgspec.Raw),
    st.builds(
        lambda seq, target, call, payload: msgspec.Raw(
            msgspec.msgpack.encode([1, seq, target, "fuzz", call, 0, payload])
        ),
        st.integers(-5, 40),
        st.sampled_from(["counter", "nobody", ""]),
        st.sampled_from([0, 0, 0, 3, -1]),
        payloads,
    ),
    st.builds(
        lambda tag, rest: msgspec.Raw(msgspec.msgpack.encode([tag, *rest])),
        st.integers(0, 9),
        st.lists(st.one_of(int64, st.text(max_size=8), st.lists(int64, max_size=3)), max_size=4),
    ),
)


@st.composite
def well_framed(draw: st.DrawFn) -> list[bytes]:
    """A header the framing check accepts (its frame counts add up), so that the items
    inside get decoded: from the fuzzer's own identity, mostly one incarnation, so that
    sequence numbers repeat within a link."""
    chosen = draw(st.lists(st.tuples(st.integers(0, 2), items), max_size=4))
    incarnation = draw(st.sampled_from([7, 7, 7, 8]))
    base, received = draw(st.integers(0, 50)), draw(st.integers(-2, 50))
    settled = draw(st.integers(-2, 50))
    head = msgspec.msgpack.encode(
        [PROTOCOL, "fuzzer", incarnation, 0, base, received, settled, chosen]
    )
    extra = [draw(st.binary(max_size=64)) for _ in range(sum(n for n, _ in chosen))]
    return [head, *extra]


frames_strategy = st.one_of(
    st.lists(st.binary(max_size=512), min_size=1, max_size=4),
    st.builds(
        lambda sender, inc, base, chosen, extra: [
            msgspec.msgpack.encode([PROTOCOL, sender, inc, 0, base, 0, 0, chosen]),
            *extra,
        ],
        st.sampled_from(["fuzzer", "", "head"]),
        int64,
        int64,
        st.lists(st.tuples(st.integers(-2, 3), items), max_size=4),
        st.lists(st.binary(max_size=64), max_size=3),
    ),
    # Twice: about half the cases get past the framing check to the items inside.
    well_framed(),
    well_framed(),
)


class FuzzReport(msgspec.Struct):
    cases: int
    seconds: float
    cases_per_second: float
    checks: int
    """Round trips through the worker that found the head still serving."""
    rejected: dict[str, int]
    """The head's rejections by reason."""
    duplicates: int
    """Data items dropped as replays of a sequence number already delivered."""


async def fuzz(rig: Rig, cases: int, *, check_every: int = 100) -> FuzzReport:
    """Send ``cases`` generated frame lists to the head, checking every
    ``check_every`` cases (and after the last) that it still serves the worker."""
    sent = 0
    checks_before = rig.checks

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(frames=frames_strategy)
    def send(frames: list[bytes]) -> None:
        nonlocal sent
        sent += 1
        rig.send(*frames)
        if sent % check_every == 0:
            anyio.from_thread.run(rig.still_serves)

    began = time.perf_counter()
    await anyio.to_thread.run_sync(send)
    await rig.still_serves()
    seconds = time.perf_counter() - began
    statistics = rig.head.statistics()
    return FuzzReport(
        cases=sent,
        seconds=round(seconds, 1),
        cases_per_second=round(sent / seconds),
        checks=rig.checks - checks_before,
        rejected=dict(sorted(statistics.rejected.items())),
        duplicates=sum(link.duplicates for link in statistics.links),
    )


async def _main(cases: int) -> FuzzReport:
    async with open_rig() as rig:
        return await fuzz(rig, cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    args = parser.parse_args()
    configure_logging("error", stream=sys.stderr)
    report = anyio.run(_main, args.cases, backend="trio")
    print(json.dumps(msgspec.to_builtins(report), indent=2))


if __name__ == "__main__":
    main()
