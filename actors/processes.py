"""The node processes of a run: one per engine (``python -m actors.engines.serve``)
and one per learner (``python -m learner.serve``), each joined to the head and logging
JSON lines to ``RUN_DIR/logs/``. A host starts the ones ``cluster.placement`` puts on
its rank."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import msgspec

from actors.run_config import JUDGE_POLICY, RunConfig

LOOPBACK = "tcp://127.0.0.1:*"


async def start_node_process(
    command: list[str], log: IO[bytes], tasks: anyio.abc.TaskGroup
) -> anyio.abc.Process:
    """Start a node process that prints one ``{"ready": ...}`` JSON line once it serves;
    returns when it did (at most 600 s). Its stderr goes to ``log``; the rest of its
    stdout is drained by a task in ``tasks``."""
    process = await anyio.open_process(command, stderr=log)
    assert process.stdout is not None
    buffered = b""
    with anyio.fail_after(600):
        while b'{"ready"' not in buffered:
            chunk = await process.stdout.receive()
            buffered += chunk
    tasks.start_soon(_drain, process.stdout)
    return process


async def _drain(stream: anyio.abc.ByteReceiveStream) -> None:
    async for _ in stream:
        pass


@asynccontextmanager
async def open_processes(
    config: RunConfig,
    run_dir: Path,
    head: str,
    models: dict[str, str],
    *,
    learners: bool,
    rank: int = 0,
    listen: str = LOOPBACK,
) -> AsyncIterator[None]:
    """The node processes ``config`` places on ``rank`` (engines, and with ``learners``
    the learners), joined to the head at ``head`` and listening on ``listen``; stopped
    (stdin closed, then killed after 30 s) when the block ends."""
    logs = run_dir / "logs"
    processes: list[anyio.abc.Process] = []
    with ExitStack() as files:
        async with anyio.create_task_group() as tasks:
            for name in config.node_processes(learners=learners):
                if config.rank_of(name) != rank:
                    continue
                command = [sys.executable, "-m", *_entry_point(config, run_dir, name, models)]
                command += ["--head", head, "--listen", listen]
                if config.cluster.keys:
                    command += ["--keys", config.cluster.keys]
                log = open_append(files, logs / f"{_file_name(name)}.jsonl")
                processes.append(await start_node_process(command, log, tasks))
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await stop_node_processes(processes)
                tasks.cancel_scope.cancel()


def _entry_point(config: RunConfig, run_dir: Path, name: str, models: dict[str, str]) -> list[str]:
    """The module and arguments that run node process ``name``."""
    kind, policy, *index = name.split("/")
    if kind == "engine":
        if policy == JUDGE_POLICY:
            engine, threads, max_batch = config.judge.engine, 1, 64
        else:
            settings = config.policies[policy]
            engine, threads, max_batch = settings.engine, settings.threads, settings.max_batch
        return [
            *("actors.engines.serve", "--policy", policy, "--model", models[policy]),
            *("--index", index[0], "--engine", engine),
            *("--threads", str(threads), "--max-batch", str(max_batch)),
        ]
    settings = config.policies[policy]
    learner = config.learner_config(
        policy,
        engines=[f"engine/{policy}/{i}" for i in range(settings.engines)],
        notify=["conductor"],
        checkpoint_dir=str(run_dir / "checkpoints" / policy),
        checkpoint_every=config.train.checkpoint_every,
    )
    return [
        *("learner.serve", "--model", models[policy], "--threads", str(settings.threads)),
        *("--config", msgspec.json.encode(learner).decode()),
    ]


async def stop_node_processes(processes: list[anyio.abc.Process]) -> None:
    """Close their stdin (a node process's signal to stop), wait up to 30 s, then kill."""
    for process in processes:
        if process.stdin is not None:
            await process.stdin.aclose()
    with anyio.move_on_after(30):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _file_name(actor: str) -> str:
    return actor.replace("/", "-")


def open_append(files: ExitStack, path: Path) -> IO[bytes]:
    return files.enter_context(open(path, "ab"))
