"""The Ray side of the runtime suite: the same jobs as the runtime's sink and echo
actors, done by a Ray actor in a Ray worker process, driven from the benchmark's
process through Ray's own API (``actor.method.remote``, ``ray.get``).

Ray is an optional benchmark dependency (the ``peers`` extra), never a runtime one;
without it the suite says so and measures the rest.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any


def available() -> bool:
    return importlib.util.find_spec("ray") is not None


class Sink:
    """Counts what it is sent; ``flush`` answers once everything sent before it was
    handled (a Ray actor runs one caller's calls in order)."""

    def __init__(self) -> None:
        self.count = 0

    def put(self, data: bytes) -> None:
        self.count += 1

    def flush(self) -> int:
        count, self.count = self.count, 0
        return count

    def ping(self, data: bytes) -> bytes:
        return data


class RaySide:
    """A local Ray cluster (two CPUs, no dashboard) with one ``Sink`` actor. Its methods
    block; the driver runs them in a worker thread."""

    def __init__(self) -> None:
        import ray

        self._ray: Any = ray
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=256 << 20,
            logging_level="ERROR",
            log_to_driver=False,
        )
        self.sink = ray.remote(Sink).remote()
        ray.get(self.sink.flush.remote())

    def throughput(self, size: int, count: int) -> float:
        ray, data = self._ray, bytes(size)
        start = time.perf_counter()
        for _ in range(count):
            self.sink.put.remote(data)
        received = ray.get(self.sink.flush.remote())
        elapsed = time.perf_counter() - start
        if received != count:
            raise RuntimeError(f"Ray sink handled {received} of {count} calls")
        return count / elapsed

    def latency(self, calls: int) -> list[float]:
        ray, ping, samples = self._ray, bytes(64), []
        for _ in range(calls):
            start = time.perf_counter()
            ray.get(self.sink.ping.remote(ping))
            samples.append(time.perf_counter() - start)
        return samples

    def close(self) -> None:
        self._ray.shutdown()
