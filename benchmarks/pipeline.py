"""Pipeline suite: training throughput under a long-tailed generation load, for three
ways of scheduling the same work on the same simulated compute.

The pipeline is the real one (``benchmarks.pipeline_sim`` replaces only the model's
decode time and the optimizer step): the driver process is the head node with the
MarsRL agents (Solver, Verifier, Corrector on one shared policy) and the conductor;
the simulated engines run in node processes of their own, the learner in another. The
schedules differ only in configuration:

* **synchronous**: every action waits for its episode's end (trajectory reward) and
  ``max_staleness`` 0: a batch of episodes is generated whole, then trained on, then
  the next batch starts with the new weights.
* **one-step-off**: the same, with ``max_staleness`` 1: the next batch generates while
  the learner trains on the last (verl's one-step-off, AReaL's staleness 1).
* **streaming s=K**: agent-specific rewards, so each group goes to the learner the
  moment its agent finishes, with ``max_staleness`` K (relaytrain's default).

Reported per schedule (median over repetitions, with min and max), over the steady
state (from the end of batch ``warmup`` to the end of the run, every schedule having
first waited for its first batches to be generated): segments trained per second,
learner idle (1 - time in optimizer steps / window), generation idle (1 - time an
engine had any request / window) and occupancy (samples of the requests in flight /
engine slots), the staleness of trained tokens over the whole run, episode failures
and learner rejections (both must be 0), and peak memory per process.

A sweep then runs streaming ``SWEEP_MODE`` with more engines, each in a node process of
its own or several sharing one, to show where throughput saturates.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import msgspec

from actors.agent import AgentActor
from actors.conductor import Conductor, ConductorConfig
from actors.messages import (
    EngineStats,
    GetEngineStats,
    GetLearnerStats,
    LearnerStats,
    SamplingParams,
)
from actors.processes import start_node_process, stop_node_processes
from actors.tiny_model import build_tiny_checkpoint
from benchmarks.harness import Figure, write_json
from benchmarks.pipeline_node import POLICY
from benchmarks.pipeline_sim import Workload, synthetic_problems
from learner.trainer import LearnerConfig
from rewards.marsrl import RewardMode
from runtime import Node, configure_logging, open_node

MODES: dict[str, tuple[RewardMode, int]] = {
    "synchronous": ("trajectory", 0),
    "one-step-off": ("trajectory", 1),
    "streaming s=1": ("agent", 1),
    "streaming s=2": ("agent", 2),
    "streaming s=4": ("agent", 4),
}
ROLES = ("solver", "verifier", "corrector")
SWEEP_MODE = "streaming s=4"
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Layout:
    engines: int
    engine_nodes: int
    """Node processes the engines are spread over."""

    def __str__(self) -> str:
        return f"{self.engines} engines / {self.engine_nodes} processes"


@dataclass(frozen=True)
class Plan:
    workload: Workload
    batches: int
    warmup: int
    """Batches before the measured window opens."""
    reps: int
    layout: Layout
    modes: tuple[str, ...]
    sweep: tuple[Layout, ...]
    in_flight_per_engine: int = 16


FULL = Plan(
    workload=Workload(),
    batches=14,
    warmup=2,
    reps=3,
    layout=Layout(4, 4),
    modes=tuple(MODES),
    sweep=(Layout(1, 1), Layout(2, 2), Layout(4, 4), Layout(4, 1), Layout(8, 4)),
)
QUICK = Plan(
    workload=Workload(step_s=0.1, median_tokens=16),
    batches=3,
    warmup=1,
    reps=1,
    layout=Layout(1, 1),
    modes=("synchronous", "streaming s=2"),
    sweep=(Layout(1, 1), Layout(2, 2)),
)


def conductor_config(mode: str, layout: Layout, plan: Plan) -> ConductorConfig:
    reward, staleness = MODES[mode]
    return ConductorConfig(
        workflow="marsrl",
        group_size=8,
        select=1,
        selection="balanced",
        max_agent_steps=3,
        reward=reward,
        max_staleness=staleness,
        problems_per_step=10,
        max_in_flight=plan.in_flight_per_engine * layout.engines,
        task_timeout=120.0,
    )


def learner_config(layout: Layout) -> LearnerConfig:
    """Staleness is bounded by admission alone (``max_staleness`` of the conductor):
    the learner's own bound is set out of reach, so every schedule trains on
    everything it generated and the staleness it reaches is measured, not clipped."""
    return LearnerConfig(
        policy=POLICY,
        groups_per_batch=32,
        max_staleness=1_000_000,
        engines=[f"engine/{POLICY}/{i}" for i in range(layout.engines)],
        notify=["conductor"],
        sync_timeout=60.0,
    )


def histogram_quantile(counts: dict[int, int], q: float) -> int:
    """The ``q`` quantile of values given as value → count."""
    total = sum(counts.values())
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return value
    return 0


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


@asynccontextmanager
async def node_processes(
    head: str, model: Path, plan: Plan, layout: Layout, log: IO[bytes]
) -> AsyncIterator[dict[str, list[anyio.abc.Process]]]:
    """The engine node processes and the learner's, joined to ``head``; stopped (stdin
    closed, then killed) when the block ends."""
    common = [
        *("--head", head, "--model", str(model)),
        *("--workload", msgspec.json.encode(plan.workload).decode()),
    ]
    entry = [sys.executable, "-m", "benchmarks.pipeline_node"]
    processes: dict[str, list[anyio.abc.Process]] = {"engines": [], "learner": []}
    commands: list[tuple[str, list[str]]] = []
    share, extra = divmod(layout.engines, layout.engine_nodes)
    first = 0
    for node in range(layout.engine_nodes):
        count = share + (node < extra)
        commands.append(
            ("engines", [*entry, "engines", *common, "--first", str(first), "--count", str(count)])
        )
        first += count
    config = msgspec.json.encode(learner_config(layout)).decode()
    commands.append(("learner", [*entry, "learner", *common, "--config", config]))
    async with anyio.create_task_group() as tasks:

        async def start(kind: str, command: list[str]) -> None:
            processes[kind].append(await start_node_process(command, log, tasks))

        try:
            async with anyio.create_task_group() as starting:  # they load torch side by side
                for kind, command in commands:
                    starting.start_soon(start, kind, command)
            yield processes
        finally:
            with anyio.CancelScope(shield=True):
                await stop_node_processes([p for group in processes.values() for p in group])
            tasks.cancel_scope.cancel()


async def run_once(
    mode: str, layout: Layout, plan: Plan, model: Path, log: IO[bytes]
) -> dict[str, Any]:
    """One run of ``mode`` on ``layout``, its engines and learner in node processes."""
    async with (
        open_node("head", listen="tcp://127.0.0.1:*") as head,
        node_processes(head.address, model, plan, layout, log) as processes,
    ):
        result = await drive(head, mode, layout, plan)
        memory = {
            "learner_mib": peak_rss_mib(processes["learner"][0].pid),
            "engine_node_mib": max(peak_rss_mib(p.pid) for p in processes["engines"]),
            "head_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    return {**result, **memory}


@dataclass(frozen=True)
class Snapshot:
    at: float
    learner: LearnerStats
    engines: list[EngineStats]


async def snapshot(head: Node, engines: Sequence[str]) -> Snapshot:
    """The learner's and the engines' counters, and when the learner answered."""
    learner = await head.lookup(f"learner/{POLICY}", timeout=10)
    stats: LearnerStats = await head.call(learner, GetLearnerStats(), timeout=120)
    at = anyio.current_time()
    engine_stats = []
    for name in engines:
        ref = await head.lookup(name, timeout=10)
        engine_stats.append(await head.call(ref, GetEngineStats(), timeout=30))
    return Snapshot(at, stats, engine_stats)


def engine_names(layout: Layout) -> list[str]:
    return [f"engine/{POLICY}/{i}" for i in range(layout.engines)]


async def start_team(head: Node, mode: str, layout: Layout, plan: Plan) -> Conductor:
    """The agents and the conductor on ``head``, connected to the serving engines and
    learner; the caller runs the conductor."""
    sampling = SamplingParams(temperature=1.0, max_tokens=plan.workload.max_tokens)
    for role in ROLES:
        agent = functools.partial(AgentActor, role, POLICY, engine_names(layout), sampling=sampling)
        await head.spawn(f"agent/{role}", agent)
    conductor = Conductor(
        conductor_config(mode, layout, plan),
        synthetic_problems(),
        policies=dict.fromkeys(ROLES, POLICY),
        agents={role: f"agent/{role}" for role in ROLES},
        learners={POLICY: f"learner/{POLICY}"},
    )
    await head.spawn("conductor", lambda: conductor)
    await conductor.connect()
    return conductor


async def drive(head: Node, mode: str, layout: Layout, plan: Plan) -> dict[str, Any]:
    """Run ``mode`` from ``head`` until the learner consumed ``plan.batches``, with the
    engines and the learner already serving; returns what it measured. Rates are taken
    between the end of batch ``plan.warmup`` and the end of the run (the steady state:
    every schedule first waits for its first batch to be generated); the staleness
    histogram covers the whole run."""
    engines = engine_names(layout)
    conductor = await start_team(head, mode, layout, plan)
    began = anyio.current_time()
    warm: list[Snapshot] = []

    async def after_warmup() -> None:
        await conductor.wait_for_batches(plan.warmup)
        warm.append(await snapshot(head, engines))

    with anyio.fail_after(RUN_TIMEOUT_S):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(after_warmup)
            await conductor.run(until_batches=plan.batches)
    ended = await snapshot(head, engines)
    first = warm[0]
    window = ended.at - first.at
    learner, engine_count = ended.learner, len(engines)
    busy = sum(e.busy_s for e in ended.engines) - sum(e.busy_s for e in first.engines)
    sequences = sum(e.sequence_s for e in ended.engines) - sum(e.sequence_s for e in first.engines)
    finished = conductor.statistics()
    staleness = learner.staleness
    tokens = max(sum(staleness.values()), 1)
    return {
        "wall_s": ended.at - began,
        "window_s": window,
        "segments_per_s": (learner.trained_segments - first.learner.trained_segments) / window,
        "run_segments_per_s": learner.trained_segments / (ended.at - began),
        "trained_segments": learner.trained_segments,
        "held_segments": learner.held_segments,
        "emitted_segments": sum(role.actions for role in finished.roles.values()),
        "versions": learner.version,
        "learner_idle": 1 - (learner.train_s - first.learner.train_s) / window,
        "publish_share": (learner.publish_s - first.learner.publish_s) / window,
        # The engines answer just after the learner: clip the skew that makes a fully
        # busy engine look idle for a negative moment.
        "generation_idle": max(0.0, 1 - busy / (engine_count * window)),
        "occupancy": sequences / (engine_count * plan.workload.slots * window),
        "staleness": dict(sorted(staleness.items())),
        "staleness_mean": sum(b * n for b, n in staleness.items()) / tokens,
        "staleness_p99": histogram_quantile(staleness, 0.99),
        "staleness_max": max(staleness, default=0),
        "episodes_failed": finished.failed,
        "rejected": sum(learner.rejected.values()),
    }


FIGURES = (
    "segments_per_s",
    "learner_idle",
    "generation_idle",
    "occupancy",
    "staleness_mean",
    "staleness_p99",
    "staleness_max",
    "learner_mib",
    "engine_node_mib",
)


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        name: Figure.of([run[name] for run in runs]).as_dict() for name in FIGURES
    }
    summary["episodes_failed"] = sum(run["episodes_failed"] for run in runs)
    summary["rejected"] = sum(run["rejected"] for run in runs)
    summary["runs"] = list(runs)
    return summary


async def measure(plan: Plan, model: Path, log: IO[bytes]) -> dict[str, Any]:
    """Every mode on the plan's layout, repetitions interleaved (so the machine's load
    drifts over all modes alike), then the sweep."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in plan.modes}
    for rep in range(plan.reps):
        for mode in plan.modes:
            result = await run_once(mode, plan.layout, plan, model, log)
            runs[mode].append(result)
            print(
                f"  rep {rep + 1}/{plan.reps} {mode:<14} {result['segments_per_s']:7.1f} seg/s  "
                f"learner idle {result['learner_idle']:.0%}",
                flush=True,
            )
    baseline = runs.get("synchronous")
    modes = {}
    for mode, mode_runs in runs.items():
        summary = summarise(mode_runs)
        if baseline:
            ratios = [
                run["segments_per_s"] / base["segments_per_s"]
                for run, base in zip(mode_runs, baseline, strict=True)
            ]
            summary["vs_synchronous"] = Figure.of(ratios).as_dict()
        modes[mode] = summary
    sweep: dict[str, Any] = {}
    for layout in plan.sweep:
        if layout == plan.layout and SWEEP_MODE in runs:
            layout_runs = runs[SWEEP_MODE]
        else:
            layout_runs = [
                await run_once(SWEEP_MODE, layout, plan, model, log) for _ in range(plan.reps)
            ]
        sweep[str(layout)] = {
            "engines": layout.engines,
            "engine_nodes": layout.engine_nodes,
            **summarise(layout_runs),
        }
        print(f"  sweep {layout}: {sweep[str(layout)]['segments_per_s']['median']:.1f} seg/s")
    return {"modes": modes, "sweep": sweep}


def print_tables(result: dict[str, Any], plan: Plan) -> None:
    print(f"\npipeline under load ({plan.layout}; median of {plan.reps}, {plan.batches} batches)")
    header = (
        f"{'schedule':<15}{'seg/s':>8}{'x sync':>8}{'learner idle':>14}{'gen idle':>10}"
        f"{'occupancy':>11}{'stale mean':>12}{'p99':>5}{'max':>5}{'failed':>8}{'rejected':>10}"
    )
    print(header)
    for mode, row in result["modes"].items():
        ratio = row.get("vs_synchronous", {}).get("median", math.nan)
        print(
            f"{mode:<15}{row['segments_per_s']['median']:8.1f}{ratio:8.2f}"
            f"{row['learner_idle']['median']:14.1%}{row['generation_idle']['median']:10.1%}"
            f"{row['occupancy']['median']:11.1%}{row['staleness_mean']['median']:12.2f}"
            f"{row['staleness_p99']['median']:5.0f}{row['staleness_max']['median']:5.0f}"
            f"{row['episodes_failed']:8d}{row['rejected']:10d}"
        )
    print(f"\nscaling ({SWEEP_MODE})")
    print(f"{'layout':<28}{'seg/s':>8}{'learner idle':>14}{'gen idle':>10}{'engine node MiB':>17}")
    for layout, row in result["sweep"].items():
        print(
            f"{layout:<28}{row['segments_per_s']['median']:8.1f}"
            f"{row['learner_idle']['median']:14.1%}{row['generation_idle']['median']:10.1%}"
            f"{row['engine_node_mib']['median']:17.0f}"
        )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    modes = list(result["modes"])
    rows = [result["modes"][m] for m in modes]
    medians = [r["segments_per_s"]["median"] for r in rows]
    errors = [
        [m - r["segments_per_s"]["min"] for m, r in zip(medians, rows, strict=True)],
        [r["segments_per_s"]["max"] - m for m, r in zip(medians, rows, strict=True)],
    ]
    left.bar(modes, medians, yerr=errors, capsize=4, color="tab:blue")
    left.set_ylabel("segments trained / s")
    left.set_title("schedule (median, min to max)")
    left.tick_params(axis="x", rotation=20)
    idle = left.twinx()
    idle.plot(modes, [r["learner_idle"]["median"] for r in rows], "o-", color="tab:red")
    idle.set_ylabel("learner idle", color="tab:red")
    idle.set_ylim(0, 1)
    layouts = list(result["sweep"])
    right.bar(
        layouts,
        [result["sweep"][k]["segments_per_s"]["median"] for k in layouts],
        color="tab:green",
    )
    right.set_title(f"scaling, {SWEEP_MODE}")
    right.set_ylabel("segments trained / s")
    right.tick_params(axis="x", rotation=20)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(quick: bool, out: Path) -> None:
    plan = QUICK if quick else FULL
    out.mkdir(parents=True, exist_ok=True)
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as tmp, open(out / "pipeline-nodes.log", "wb") as log:
        model = build_tiny_checkpoint(Path(tmp) / "tiny", max_positions=4096)
        print(f"pipeline: workload {msgspec.json.encode(plan.workload).decode()}", flush=True)
        result = anyio.run(measure, plan, model, log, backend="trio")
    print_tables(result, plan)
    path = write_json(
        out,
        "pipeline",
        {
            "workload": msgspec.to_builtins(plan.workload),
            "layout": str(plan.layout),
            "batches": plan.batches,
            "reps": plan.reps,
            "cpus_available": len(os.sched_getaffinity(0)),
            **result,
        },
    )
    plot(result, out / "pipeline.png")
    print(f"wrote {path} and {out / 'pipeline.png'}")
