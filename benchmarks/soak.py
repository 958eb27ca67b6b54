"""Soak suite: the synthetic pipeline at full rate for a fixed time, watching every
process's memory and every bounded queue.

The pipeline is the pipeline suite's (real agents and conductor on the head, the
simulated engines and learner in node processes of their own), streaming with
``max_staleness`` 4 on four engines in four processes, its long-tailed workload
unchanged; it runs until the time is up rather than to a batch count. Every
``interval`` seconds the suite samples each process's resident memory (VmRSS), the
head's actor mailboxes against their capacity, the unacknowledged messages on the
head's links, the learner's held segments and the engines' waiting requests.

A leak shows as a slope: the table gives each process's RSS at the start of the steady
state (the median of the samples in the second tenth of the run, once every process
has loaded and warmed its caches) and at its end (the median of the last tenth), and
the largest queue depth seen against its bound.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import msgspec

from actors.messages import GetEngineStats, GetLearnerStats, LearnerStats
from actors.tiny_model import build_tiny_checkpoint
from benchmarks.harness import write_json
from benchmarks.pipeline import (
    FULL,
    SWEEP_MODE,
    Layout,
    engine_names,
    node_processes,
    start_team,
)
from benchmarks.pipeline_node import POLICY
from runtime import Node, configure_logging, open_node

LAYOUT = Layout(4, 4)
SOAK_S, INTERVAL_S = 600.0, 10.0
QUICK_S, QUICK_INTERVAL_S = 20.0, 2.0


def rss_mib(pid: int) -> float:
    """A process's resident memory now (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


async def sample(
    head: Node, processes: dict[str, list[anyio.abc.Process]], began: float
) -> dict[str, Any]:
    """One sample: RSS per process, and the depth of every bounded queue in reach."""
    rss = {"head": rss_mib(os.getpid()), "learner": rss_mib(processes["learner"][0].pid)}
    for index, process in enumerate(processes["engines"]):
        rss[f"engines-{index}"] = rss_mib(process.pid)
    learner = await head.lookup(f"learner/{POLICY}", timeout=10)
    learned: LearnerStats = await head.call(learner, GetLearnerStats(), timeout=120)
    waiting = 0
    for name in engine_names(LAYOUT):
        engine = await head.lookup(name, timeout=10)
        waiting = max(waiting, (await head.call(engine, GetEngineStats(), timeout=30)).waiting)
    node = head.statistics()
    return {
        "t": anyio.current_time() - began,
        "rss_mib": rss,
        "mailbox": {a.name: a.mailbox for a in node.actors},
        "unacked": max((link.unacked for link in node.links), default=0),
        "held_segments": learned.held_segments,
        "engine_waiting": waiting,
        "trained_segments": learned.trained_segments,
        "version": learned.version,
    }


async def soak(seconds: float, interval: float, model: Path, log: IO[bytes]) -> dict[str, Any]:
    plan = FULL
    samples: list[dict[str, Any]] = []
    async with (
        open_node("head", listen="tcp://127.0.0.1:*") as head,
        node_processes(head.address, model, plan, LAYOUT, log) as processes,
    ):
        conductor = await start_team(head, SWEEP_MODE, LAYOUT, plan)
        began = anyio.current_time()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: conductor.run(until_batches=sys.maxsize))
            while anyio.current_time() - began < seconds:
                await anyio.sleep(interval)
                samples.append(await sample(head, processes, began))
                print(
                    f"  {samples[-1]['t']:6.0f} s  version {samples[-1]['version']:5d}  RSS "
                    + " ".join(f"{k} {v:.0f}" for k, v in samples[-1]["rss_mib"].items()),
                    flush=True,
                )
            tasks.cancel_scope.cancel()
        failed = conductor.statistics().failed
        capacity = {a.name: a.capacity for a in head.statistics().actors}
    return summarise(samples, capacity, failed)


def _window(samples: Sequence[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    count = len(samples)
    chosen = samples[int(start * count) : max(int(end * count), int(start * count) + 1)]
    return list(chosen)


def summarise(
    samples: Sequence[dict[str, Any]], capacity: dict[str, int], failed: int
) -> dict[str, Any]:
    early, late = _window(samples, 0.1, 0.2), _window(samples, 0.9, 1.0)
    memory = {}
    for process in samples[0]["rss_mib"]:
        start = statistics.median(s["rss_mib"][process] for s in early)
        end = statistics.median(s["rss_mib"][process] for s in late)
        memory[process] = {
            "start_mib": start,
            "end_mib": end,
            "growth_mib": end - start,
            "max_mib": max(s["rss_mib"][process] for s in samples),
        }
    mailboxes = {
        name: {"max": max(s["mailbox"].get(name, 0) for s in samples), "capacity": bound}
        for name, bound in capacity.items()
    }
    seconds = samples[-1]["t"]
    return {
        "seconds": seconds,
        "samples": list(samples),
        "memory": memory,
        "mailboxes": mailboxes,
        "max_unacked": max(s["unacked"] for s in samples),
        "max_held_segments": max(s["held_segments"] for s in samples),
        "max_engine_waiting": max(s["engine_waiting"] for s in samples),
        "trained_segments": samples[-1]["trained_segments"],
        "segments_per_s": samples[-1]["trained_segments"] / seconds,
        "episodes_failed": failed,
    }


def print_tables(result: dict[str, Any]) -> None:
    print(
        f"\nsoak: {result['seconds']:.0f} s of {SWEEP_MODE} on {LAYOUT}, "
        f"{result['trained_segments']} segments trained ({result['segments_per_s']:.0f}/s), "
        f"{result['episodes_failed']} episodes failed"
    )
    print(f"{'process':<12}{'RSS start MiB':>15}{'end MiB':>10}{'growth':>9}{'max':>8}")
    for process, row in result["memory"].items():
        print(
            f"{process:<12}{row['start_mib']:15.0f}{row['end_mib']:10.0f}"
            f"{row['growth_mib']:+9.1f}{row['max_mib']:8.0f}"
        )
    print(f"{'queue':<28}{'max depth':>10}{'bound':>8}")
    for name, row in result["mailboxes"].items():
        print(f"{'mailbox ' + name:<28}{row['max']:10d}{row['capacity']:8d}")
    print(f"{'unacked on a link':<28}{result['max_unacked']:10d}")
    print(f"{'learner held segments':<28}{result['max_held_segments']:10d}")
    print(f"{'engine waiting requests':<28}{result['max_engine_waiting']:10d}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4))
    times = [s["t"] / 60 for s in result["samples"]]
    for process in result["memory"]:
        axes.plot(times, [s["rss_mib"][process] for s in result["samples"]], label=process)
    axes.set_xlabel("minutes")
    axes.set_ylabel("resident memory (MiB)")
    axes.set_ylim(bottom=0)
    axes.set_title(f"soak: {SWEEP_MODE}, {LAYOUT}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(quick: bool, out: Path) -> None:
    seconds, interval = (QUICK_S, QUICK_INTERVAL_S) if quick else (SOAK_S, INTERVAL_S)
    out.mkdir(parents=True, exist_ok=True)
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as tmp, open(out / "soak-nodes.log", "wb") as log:
        model = build_tiny_checkpoint(Path(tmp) / "tiny", max_positions=4096)
        print(f"soak: {seconds:.0f} s, a sample every {interval:.0f} s", flush=True)
        result = anyio.run(soak, seconds, interval, model, log, backend="trio")
    print_tables(result)
    path = write_json(
        out,
        "soak",
        {"workload": msgspec.to_builtins(FULL.workload), "layout": str(LAYOUT), **result},
    )
    plot(result, out / "soak.png")
    print(f"wrote {path} and {out / 'soak.png'}")
