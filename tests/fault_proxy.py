"""A TCP proxy that puts link trouble between two nodes: delay, stalls, connection
resets, and partitions that heal.

This kernel has no netem, so trouble on a link is made in user space: a node is told to
reach its peer at the proxy's address, and the proxy forwards the bytes, holding them
back, cutting the connections with a reset (RST, as a crashed middlebox or a NAT that
forgot the flow does), or refusing every connection for a while. ZeroMQ reconnects on
its own; what the runtime must show is that nothing a node accepted is lost or handled
twice across the trouble.

Used by the tests, and from the command line between two hosts (or network
namespaces)::

    python -m tests.fault_proxy --listen 10.0.0.1:7001 --upstream 10.0.1.2:7001 \\
        --delay 0.005 --every 5 --seed 0

which forwards with 5 ms of added delay and every ~5 s injects a random fault (a stall,
a reset, or a partition of 1-4 s), logging each as a JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

_CHUNK = 1 << 16


@dataclass(eq=False)
class _Pair:
    client: anyio.abc.SocketStream
    upstream: anyio.abc.SocketStream
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class FaultProxy:
    """Forwards every connection made to it to ``upstream`` (host, port); the fault
    methods act on all its connections at once. ``counts`` tallies connections and the
    faults injected."""

    def __init__(self, upstream: tuple[str, int], *, delay: float = 0.0) -> None:
        self.upstream = upstream
        self.delay = delay
        self.port = 0
        self.counts: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self._flowing = anyio.Event()
        self._flowing.set()
        self._partitioned = False

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, task_status: anyio.abc.TaskStatus[int]
    ) -> None:
        """Listen on ``host``:``port`` (0: any free port, then ``self.port``) until
        cancelled; ``task_status`` gets the port."""
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
        self.port = int(listener.extra(SocketAttribute.local_port))
        task_status.started(self.port)
        async with listener:
            await listener.serve(self._handle)

    def stall(self) -> None:
        """Hold every byte in both directions until ``resume``; connections stay open."""
        self._flowing = anyio.Event()
        self.counts["stalls"] += 1

    def resume(self) -> None:
        self._flowing.set()

    def reset(self) -> None:
        """Cut every open connection with a reset; new connections are accepted."""
        for pair in list(self._pairs):
            _reset_on_close(pair.client)
            _reset_on_close(pair.upstream)
            pair.scope.cancel()
        self.counts["resets"] += 1

    def partition(self) -> None:
        """Reset every connection and refuse new ones until ``heal``."""
        self._partitioned = True
        self.reset()
        self.counts["resets"] -= 1
        self.counts["partitions"] += 1

    def heal(self) -> None:
        self._partitioned = False

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.counts["connections"] += 1
        async with client:
            if self._partitioned:
                self.counts["refused"] += 1
                _reset_on_close(client)
                return
            try:
                upstream = await anyio.connect_tcp(*self.upstream)
            except OSError:
                self.counts["upstream_unreachable"] += 1
                _reset_on_close(client)
                return
            async with upstream:
                pair = _Pair(client, upstream)
                self._pairs.add(pair)
                try:
                    with pair.scope:
                        async with anyio.create_task_group() as pumps:
                            pumps.start_soon(self._pump, client, upstream, pair.scope)
                            pumps.start_soon(self._pump, upstream, client, pair.scope)
                finally:
                    self._pairs.discard(pair)

    async def _pump(
        self,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        scope: anyio.CancelScope,
    ) -> None:
        try:
            while True:
                chunk = await source.receive(_CHUNK)
                if self.delay:
                    await anyio.sleep(self.delay)
                await self._flowing.wait()
                await sink.send(chunk)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            scope.cancel()


def _reset_on_close(stream: anyio.abc.SocketStream) -> None:
    """Make closing ``stream`` send a TCP reset rather than an orderly FIN."""
    raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
    with contextlib.suppress(OSError):
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


FAULTS = ("stall", "reset", "partition")


async def inject_randomly(
    proxy: FaultProxy,
    *,
    every: float,
    seed: int,
    duration: tuple[float, float] = (1.0, 4.0),
    on_fault: Callable[[str, float], None] | None = None,
) -> None:
    """Until cancelled: wait ``every`` seconds (±50%), then inject a random fault that
    lasts a random time in ``duration`` (a reset is instant); ``on_fault`` hears of
    each as it starts."""
    rng = random.Random(seed)
    while True:
        await anyio.sleep(every * rng.uniform(0.5, 1.5))
        fault = rng.choice(FAULTS)
        lasts = rng.uniform(*duration) if fault != "reset" else 0.0
        if on_fault is not None:
            on_fault(fault, lasts)
        if fault == "stall":
            proxy.stall()
            await anyio.sleep(lasts)
            proxy.resume()
        elif fault == "reset":
            proxy.reset()
        else:
            proxy.partition()
            await anyio.sleep(lasts)
            proxy.heal()


def _print_fault(fault: str, lasts: float) -> None:
    record = {"time": round(time.time(), 3), "fault": fault, "lasts": round(lasts, 2)}
    print(json.dumps(record), flush=True)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _main(args: argparse.Namespace) -> None:
    proxy = FaultProxy(args.upstream, delay=args.delay)
    async with anyio.create_task_group() as tasks:
        await tasks.start(proxy.serve, *args.listen)
        if args.every > 0:
            tasks.start_soon(
                lambda: inject_randomly(
                    proxy,
                    every=args.every,
                    seed=args.seed,
                    duration=tuple(args.duration),
                    on_fault=_print_fault,
                )
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fault_proxy", description=__doc__)
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added per chunk")
    parser.add_argument("--every", type=float, default=0.0, help="mean seconds between faults")
    parser.add_argument("--duration", type=float, nargs=2, default=[1.0, 4.0])
    parser.add_argument("--seed", type=int, default=0)
    anyio.run(_main, parser.parse_args(argv), backend="trio")


if __name__ == "__main__":
    main()
