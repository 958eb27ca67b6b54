"""Runtime suite: actor-to-actor throughput and call latency between two node processes,
against raw blocking pyzmq doing the same over the same transport, in the same run.

For each transport (ipc, tcp) and payload size, the driver node sends ``count``
messages to a sink actor in a peer process, then calls ``Flush``, which is answered
once the sink has handled all of them: throughput is ``count`` over that time. The raw
baseline pushes the same number of frames over PUSH/PULL and waits for the peer's
count. Latency is the round trip of a 64-byte ``call`` against a REQ/REP round trip.
Runtime and raw repetitions alternate, so both see the same moment of a shared, noisy
machine. Every figure is the median of ``reps`` repetitions; a ratio is the median of
the per-repetition ratios (each runtime repetition against the raw one beside it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import zmq

from benchmarks.harness import Figure, percentile, write_json
from benchmarks.runtime_messages import Flush, Payload, Ping
from runtime import ActorRef, Blob, Node, open_node

SIZES = [64, 1024, 64 * 1024, 1024 * 1024]
FULL: dict[str, Any] = {
    "reps": 5,
    "latency_calls": 2000,
    "counts": {64: 200_000, 1024: 100_000, 65536: 10_000, 1048576: 1_000},
}
QUICK: dict[str, Any] = {
    "reps": 1,
    "latency_calls": 200,
    "counts": {64: 5_000, 1024: 5_000, 65536: 500, 1048576: 50},
}
BULK = 64 * 1024

TARGETS = {
    "small messages >= 25% of raw": (64, 0.25),
    "1 MiB bandwidth >= 80% of raw": (1024 * 1024, 0.80),
}
LATENCY_TARGET = 3.0


def payload(size: int) -> Payload:
    if size < BULK:
        return Payload(size, inline=bytes(size))
    return Payload(size, blob=Blob(bytearray(size)))


def _peer(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.runtime_peer", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


class _RuntimeSide:
    """The driver node's half of the runtime measurements; the peer process hosts the
    sink and echo actors."""

    def __init__(self, node: Node, sink: ActorRef, echo: ActorRef) -> None:
        self.node, self.sink, self.echo = node, sink, echo

    async def throughput(self, size: int, count: int) -> float:
        message = payload(size)
        start = time.perf_counter()
        for _ in range(count):
            await self.node.send(self.sink, message)
        flushed = await self.node.call(self.sink, Flush(), timeout=600)
        elapsed = time.perf_counter() - start
        if flushed.count != count:
            raise RuntimeError(f"sink handled {flushed.count} of {count} messages")
        return count / elapsed

    async def latency(self, calls: int) -> list[float]:
        ping, samples = Ping(bytes(64)), []
        for _ in range(calls):
            start = time.perf_counter()
            await self.node.call(self.echo, ping, timeout=60)
            samples.append(time.perf_counter() - start)
        return samples


class _RawSide:
    """Blocking pyzmq PUSH/PULL and REQ/REP against the raw peer process; its methods
    block, so the driver runs them in a worker thread while its event loop idles."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], addresses: dict[str, str]):
        self.push, self.pull, self.req = (context.socket(k) for k in (zmq.PUSH, zmq.PULL, zmq.REQ))
        for sock, name in ((self.push, "pull"), (self.pull, "push"), (self.req, "rep")):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(addresses[name])

    def throughput(self, size: int, count: int) -> float:
        data, zero_copy = bytearray(size), size >= BULK
        start = time.perf_counter()
        for _ in range(count):
            self.push.send(data, 0, not zero_copy)
        self.push.send(b"END")
        received = int(self.pull.recv())
        elapsed = time.perf_counter() - start
        if received != count:
            raise RuntimeError(f"raw peer received {received} of {count} frames")
        return count / elapsed

    def latency(self, calls: int) -> list[float]:
        ping, samples = bytes(64), []
        for _ in range(calls):
            start = time.perf_counter()
            self.req.send(ping)
            self.req.recv()
            samples.append(time.perf_counter() - start)
        return samples

    def stop(self) -> None:
        self.push.send(b"STOP")


async def _measure(transport: str, workdir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Alternate runtime and raw repetition by repetition, so both see the same machine
    (it is shared and noisy); the first repetition of each figure warms up."""
    listen = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{workdir}/driver"
    peer_listen = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{workdir}/peer"
    samples: dict[str, Any] = {"runtime": {}, "raw": {}, "runtime_latency": [], "raw_latency": []}
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    async with open_node("bench", listen=listen) as node:
        peer = _peer("runtime", "--head", node.address, "--listen", peer_listen)
        raw_peer = _peer("raw", "--transport", transport, "--dir", str(workdir))
        assert peer.stdout is not None and peer.stdin is not None and raw_peer.stdout is not None
        try:
            await anyio.to_thread.run_sync(peer.stdout.readline)
            addresses = json.loads(await anyio.to_thread.run_sync(raw_peer.stdout.readline))
            ours = _RuntimeSide(
                node, await node.lookup("sink", timeout=60), await node.lookup("echo", timeout=60)
            )
            raw = _RawSide(context, addresses)
            for size in SIZES:
                count = plan["counts"][size]
                for rep in range(plan["reps"] + 1):
                    mine = await ours.throughput(size, count)
                    theirs = await anyio.to_thread.run_sync(raw.throughput, size, count)
                    if rep:
                        samples["runtime"].setdefault(size, []).append(mine)
                        samples["raw"].setdefault(size, []).append(theirs)
            for rep in range(plan["reps"] + 1):
                mine_calls = await ours.latency(plan["latency_calls"])
                raw_calls = await anyio.to_thread.run_sync(raw.latency, plan["latency_calls"])
                if rep:
                    for side, calls in (("runtime", mine_calls), ("raw", raw_calls)):
                        samples[f"{side}_latency"].append(
                            (percentile(calls, 0.5), percentile(calls, 0.99))
                        )
            raw.stop()
        finally:
            peer.stdin.close()
            await anyio.to_thread.run_sync(peer.wait)
            await anyio.to_thread.run_sync(raw_peer.wait, 30)
            context.destroy(linger=0)
    return samples


def run(quick: bool, out: Path) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    rows, latency_rows, checks = [], [], []
    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp:
        for transport in ("ipc", "tcp"):
            workdir = Path(tmp) / transport
            workdir.mkdir()
            measured = anyio.run(_measure, transport, workdir, plan, backend="trio")
            for size in SIZES:
                ours, raws = measured["runtime"][size], measured["raw"][size]
                mine, theirs = Figure.of(ours), Figure.of(raws)
                rows.append(
                    {
                        "transport": transport,
                        "size": size,
                        "count": plan["counts"][size],
                        "runtime_msgs_per_s": mine.as_dict(),
                        "raw_msgs_per_s": theirs.as_dict(),
                        "runtime_mb_per_s": mine.median * size / 1e6,
                        "raw_mb_per_s": theirs.median * size / 1e6,
                        "ratio": Figure.of([a / b for a, b in zip(ours, raws, strict=True)]).median,
                    }
                )
            p50 = Figure.of([p for p, _ in measured["runtime_latency"]])
            p99 = Figure.of([p for _, p in measured["runtime_latency"]])
            raw50 = Figure.of([p for p, _ in measured["raw_latency"]])
            raw99 = Figure.of([p for _, p in measured["raw_latency"]])
            paired = zip(measured["runtime_latency"], measured["raw_latency"], strict=True)
            latency_rows.append(
                {
                    "transport": transport,
                    "calls": plan["latency_calls"],
                    "runtime_p50_us": p50.median * 1e6,
                    "runtime_p99_us": p99.median * 1e6,
                    "raw_p50_us": raw50.median * 1e6,
                    "raw_p99_us": raw99.median * 1e6,
                    "runtime_p50_range_us": [p50.low * 1e6, p50.high * 1e6],
                    "ratio_p50": Figure.of([a[0] / b[0] for a, b in paired]).median,
                }
            )
    for name, (size, floor) in TARGETS.items():
        for row in rows:
            if row["size"] == size:
                checks.append(
                    {
                        "target": f"{name} ({row['transport']})",
                        "value": row["ratio"],
                        "met": row["ratio"] >= floor,
                    }
                )
    for row in latency_rows:
        checks.append(
            {
                "target": f"call p50 <= {LATENCY_TARGET}x raw REQ/REP ({row['transport']})",
                "value": row["ratio_p50"],
                "met": row["ratio_p50"] <= LATENCY_TARGET,
            }
        )
    result = {
        "quick": quick,
        "reps": plan["reps"],
        "throughput": rows,
        "latency": latency_rows,
        "targets": checks,
    }
    write_json(out, "runtime", result)
    print_table(result)
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"runtime suite: median of {result['reps']} repetitions"
        f"{' (quick: too short to read speed from)' if result['quick'] else ''}"
    )
    print(
        f"{'transport':<9} {'payload':>8} {'runtime msg/s':>14} {'raw msg/s':>12} "
        f"{'runtime MB/s':>13} {'raw MB/s':>10} {'ratio':>7}"
    )
    for row in result["throughput"]:
        size = row["size"]
        label = f"{size // 1024} KiB" if size >= 1024 else f"{size} B"
        label = "1 MiB" if size == 1024 * 1024 else label
        print(
            f"{row['transport']:<9} {label:>8} {row['runtime_msgs_per_s']['median']:>14,.0f} "
            f"{row['raw_msgs_per_s']['median']:>12,.0f} {row['runtime_mb_per_s']:>13,.1f} "
            f"{row['raw_mb_per_s']:>10,.1f} {row['ratio']:>7.2f}"
        )
    print(
        f"\n{'transport':<9} {'call p50 µs':>12} {'call p99 µs':>12} {'REQ/REP p50':>12} "
        f"{'REQ/REP p99':>12} {'ratio p50':>10}"
    )
    for row in result["latency"]:
        print(
            f"{row['transport']:<9} {row['runtime_p50_us']:>12.0f} {row['runtime_p99_us']:>12.0f} "
            f"{row['raw_p50_us']:>12.0f} {row['raw_p99_us']:>12.0f} {row['ratio_p50']:>10.2f}"
        )
    print()
    for check in result["targets"]:
        print(f"{'met ' if check['met'] else 'MISS'}  {check['target']}: {check['value']:.2f}")
