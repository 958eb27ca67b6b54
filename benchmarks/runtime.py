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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import zmq

from benchmarks import runtime_ray
from benchmarks.harness import Figure, percentile, write_json
from benchmarks.runtime_messages import Flush, Payload, Ping
from runtime import ActorRef, Blob, Node, open_node

SIZES = [64, 1024, 64 * 1024, 1024 * 1024]
FULL: dict[str, Any] = {
    "reps": 5,
    "latency_calls": 2000,
    "counts": {64: 200_000, 1024: 100_000, 65536: 10_000, 1048576: 1_000},
    "ray_counts": {64: 20_000, 1024: 20_000, 65536: 4_000, 1048576: 400},
}
QUICK: dict[str, Any] = {
    "reps": 1,
    "latency_calls": 200,
    "counts": {64: 5_000, 1024: 5_000, 65536: 500, 1048576: 50},
    "ray_counts": {64: 500, 1024: 500, 65536: 100, 1048576: 20},
}
BULK = 64 * 1024

TARGETS = {
    "small messages >= 25% of raw": (64, 0.25),
    "1 MiB bandwidth >= 80% of raw": (1024 * 1024, 0.80),
}
LATENCY_TARGET = 3.0
PEERS_COMMAND = "RELAYTRAIN_EXTRAS=ml,test,peers bin/bench"
RAY_TARGET = 10.0
"""Small messages: at least this many times Ray's calls per second."""


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


@asynccontextmanager
async def _runtime_peer(listen: str, peer_listen: str) -> AsyncIterator[_RuntimeSide]:
    """A driver node listening on ``listen`` and the peer process's sink and echo."""
    async with open_node("bench", listen=listen) as node:
        peer = _peer("runtime", "--head", node.address, "--listen", peer_listen)
        assert peer.stdout is not None and peer.stdin is not None
        try:
            await anyio.to_thread.run_sync(peer.stdout.readline)
            yield _RuntimeSide(
                node, await node.lookup("sink", timeout=60), await node.lookup("echo", timeout=60)
            )
        finally:
            peer.stdin.close()
            await anyio.to_thread.run_sync(peer.wait)


async def _alternate(
    ours: _RuntimeSide, theirs: Any, name: str, counts: dict[int, int], plan: dict[str, Any]
) -> dict[str, Any]:
    """Repetitions of ours and of ``theirs`` (a blocking side, run in a worker thread)
    in turn, so both see the same machine (it is shared and noisy); the first
    repetition of each figure warms up."""
    samples: dict[str, Any] = {
        "runtime": {},
        name: {},
        "runtime_latency": [],
        f"{name}_latency": [],
    }
    for size in SIZES:
        for rep in range(plan["reps"] + 1):
            mine = await ours.throughput(size, counts[size])
            other = await anyio.to_thread.run_sync(theirs.throughput, size, counts[size])
            if rep:
                samples["runtime"].setdefault(size, []).append(mine)
                samples[name].setdefault(size, []).append(other)
    for rep in range(plan["reps"] + 1):
        mine_calls = await ours.latency(plan["latency_calls"])
        other_calls = await anyio.to_thread.run_sync(theirs.latency, plan["latency_calls"])
        if rep:
            for side, calls in (("runtime", mine_calls), (name, other_calls)):
                samples[f"{side}_latency"].append((percentile(calls, 0.5), percentile(calls, 0.99)))
    return samples


async def _measure(transport: str, workdir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The runtime against raw pyzmq over ``transport``."""
    listen = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{workdir}/driver"
    peer_listen = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{workdir}/peer"
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    raw_peer = _peer("raw", "--transport", transport, "--dir", str(workdir))
    assert raw_peer.stdout is not None
    try:
        async with _runtime_peer(listen, peer_listen) as ours:
            addresses = json.loads(await anyio.to_thread.run_sync(raw_peer.stdout.readline))
            raw = _RawSide(context, addresses)
            samples = await _alternate(ours, raw, "raw", plan["counts"], plan)
            raw.stop()
    finally:
        await anyio.to_thread.run_sync(raw_peer.wait, 30)
        context.destroy(linger=0)
    return samples


async def _measure_ray(plan: dict[str, Any]) -> dict[str, Any]:
    """The runtime over tcp against Ray actors (Ray's own transport) doing the same."""
    ray_side = await anyio.to_thread.run_sync(runtime_ray.RaySide)
    try:
        async with _runtime_peer("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as ours:
            return await _alternate(ours, ray_side, "ray", plan["ray_counts"], plan)
    finally:
        ray_side.close()


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
    ray = _against_ray(plan, checks)
    result = {
        "quick": quick,
        "reps": plan["reps"],
        "throughput": rows,
        "latency": latency_rows,
        "ray": ray,
        "targets": checks,
    }
    write_json(out, "runtime", result)
    print_table(result)
    return result


def _against_ray(plan: dict[str, Any], checks: list[dict[str, Any]]) -> dict[str, Any]:
    if not runtime_ray.available():
        return {"skipped": f"ray is not installed ({PEERS_COMMAND} installs it)"}
    measured = anyio.run(_measure_ray, plan, backend="trio")
    rows = []
    for size in SIZES:
        ours, theirs = measured["runtime"][size], measured["ray"][size]
        rows.append(
            {
                "size": size,
                "count": plan["ray_counts"][size],
                "runtime_msgs_per_s": Figure.of(ours).as_dict(),
                "ray_msgs_per_s": Figure.of(theirs).as_dict(),
                "ratio": Figure.of([a / b for a, b in zip(ours, theirs, strict=True)]).median,
            }
        )
    paired = list(zip(measured["runtime_latency"], measured["ray_latency"], strict=True))
    latency = {
        "runtime_p50_us": Figure.of([a[0] for a, _ in paired]).median * 1e6,
        "runtime_p99_us": Figure.of([a[1] for a, _ in paired]).median * 1e6,
        "ray_p50_us": Figure.of([b[0] for _, b in paired]).median * 1e6,
        "ray_p99_us": Figure.of([b[1] for _, b in paired]).median * 1e6,
        "ratio_p50": Figure.of([b[0] / a[0] for a, b in paired]).median,
    }
    small = rows[0]["ratio"]
    checks.append(
        {
            "target": f"small messages >= {RAY_TARGET:g}x Ray's",
            "value": small,
            "met": small >= RAY_TARGET,
        }
    )
    return {"throughput": rows, "latency": latency}


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
        print(
            f"{row['transport']:<9} {_size_label(row['size']):>8} "
            f"{row['runtime_msgs_per_s']['median']:>14,.0f} "
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
    ray = result["ray"]
    if "skipped" in ray:
        print(f"\nagainst Ray: skipped, {ray['skipped']}")
    else:
        print(f"\n{'payload':>8} {'runtime msg/s (tcp)':>20} {'Ray calls/s':>12} {'ratio':>7}")
        for row in ray["throughput"]:
            print(
                f"{_size_label(row['size']):>8} {row['runtime_msgs_per_s']['median']:>20,.0f} "
                f"{row['ray_msgs_per_s']['median']:>12,.0f} {row['ratio']:>7.1f}"
            )
        latency = ray["latency"]
        print(
            f"call p50 / p99: runtime {latency['runtime_p50_us']:.0f} / "
            f"{latency['runtime_p99_us']:.0f} µs, Ray {latency['ray_p50_us']:.0f} / "
            f"{latency['ray_p99_us']:.0f} µs (Ray's p50 / ours: {latency['ratio_p50']:.2f})"
        )
    print()
    for check in result["targets"]:
        print(f"{'met ' if check['met'] else 'MISS'}  {check['target']}: {check['value']:.2f}")


def _size_label(size: int) -> str:
    if size == 1024 * 1024:
        return "1 MiB"
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"
