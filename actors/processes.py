"""The node processes of a run: one per engine (``python -m actors.engines.serve``)
and one per learner (``python -m learner.serve``), each joined to the head and logging
JSON lines to ``RUN_DIR/logs/``. A host starts the ones ``cluster.placement`` puts on
its rank.

A node process that dies while the run goes on is started again, up to
``cluster.restarts`` times, listening on the address it had, so the peers that dial it
reach the new one; the runtime's links resend it what the dead one never
acknowledged. A learner resumes from its checkpoint and segment log; an engine starts
from the policy's initial weights and asks its learner for the current ones."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import IO, NamedTuple

import anyio
import anyio.abc
import msgspec

from actors.ledger import learner_ledger
from actors.run_config import JUDGE_POLICY, RunConfig

LOOPBACK = "tcp://127.0.0.1:*"


async def start_node_process(
    command: list[str], log: IO[bytes], tasks: anyio.abc.TaskGroup
) -> anyio.abc.Process:
    """Start a node process that prints one ``{"ready": ...}`` JSON line once it serves;
    returns when it did (at most 600 s). Its stderr goes to ``log``; the rest of its
    stdout is drained by a task in ``tasks``."""
    process, _ = await _start(command[2], command, log, tasks)
    return process


async def _start(
    name: str, command: list[str], log: IO[bytes], tasks: anyio.abc.TaskGroup
) -> tuple[anyio.abc.Process, str]:
    """The started process and the address its ready line says it listens on."""
    process = await anyio.open_process(command, stderr=log)
    assert process.stdout is not None
    buffered = b""
    with anyio.fail_after(600):
        while (start := buffered.find(b'{"ready"')) < 0 or b"\n" not in buffered[start:]:
            try:
                buffered += await process.stdout.receive()
            except anyio.EndOfStream:
                code = await process.wait()
                raise NodeProcessFailed(
                    f"node process {name} exited with {code} before it served"
                ) from None
    line = buffered[start:].split(b"\n", 1)[0]
    tasks.start_soon(_drain, process.stdout)
    return process, str(msgspec.json.decode(line)["ready"])


class NodeProcessFailed(RuntimeError):
    """A node process died before it served, or more often than it may be restarted."""


class SupervisedProcess:
    """One node process of the run, the command that starts it and how often it did."""

    def __init__(self, name: str, command: list[str], log: IO[bytes]) -> None:
        assert command[-2] == "--listen", "the listen address is the command's last argument"
        self.name = name
        self.command = command
        self.log = log
        self.process: anyio.abc.Process | None = None
        self.restarts = 0

    async def start(self, tasks: anyio.abc.TaskGroup) -> None:
        self.process, address = await _start(self.name, self.command, self.log, tasks)
        if self.command[-1].endswith(":*"):
            # Started again, it listens where it did: the peers that dial it find it there.
            self.command = [*self.command[:-1], address]

    async def keep_running(
        self,
        limit: int,
        tasks: anyio.abc.TaskGroup,
        stopping: anyio.Event,
        hung: Hung | None = None,
    ) -> None:
        """Start the process again each time it dies, until the run stops; raises
        ``NodeProcessFailed`` when it died more than ``limit`` times. With ``hung``, a
        process that stops answering is killed, and so started again."""
        while True:
            assert self.process is not None
            async with anyio.create_task_group() as watching:
                if hung is not None:
                    watching.start_soon(self._kill_when_hung, self.process, hung, stopping)
                code = await self.process.wait()
                watching.cancel_scope.cancel()
            if stopping.is_set():
                return
            if self.restarts >= limit:
                raise NodeProcessFailed(
                    f"node process {self.name} exited with {code} after {self.restarts} "
                    f"restarts (cluster.restarts = {limit})"
                )
            self.restarts += 1
            print(
                f"node process {self.name} exited with {code}; starting it again "
                f"({self.restarts} of {limit})",
                flush=True,
            )
            await self.start(tasks)
            print(f"node process {self.name} serves again", flush=True)

    async def _kill_when_hung(
        self, process: anyio.abc.Process, hung: Hung, stopping: anyio.Event
    ) -> None:
        silent_since: float | None = None
        while not stopping.is_set():
            await anyio.sleep(min(1.0, hung.after / 4))
            if hung.answering(self.name):
                silent_since = None
                continue
            now = anyio.current_time()
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= hung.after:
                print(
                    f"node process {self.name} has not answered for {hung.after:g} s; killing it",
                    flush=True,
                )
                process.kill()
                return


class Hung(NamedTuple):
    """How to tell a hung node process: ``answering(name)`` is False while the head's
    heartbeats declare the node down; ``after`` is the grace in seconds."""

    answering: Callable[[str], bool]
    after: float


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
    answering: Callable[[str], bool] | None = None,
) -> AsyncIterator[None]:
    """The node processes ``config`` places on ``rank`` (engines, and with ``learners``
    the learners), joined to the head at ``head`` and listening on ``listen``; each
    started again when it dies (at most ``cluster.restarts`` times) or, given
    ``answering`` (whether a node answers the caller's heartbeats), when it stopped
    answering for ``cluster.hung_after`` seconds; all stopped (stdin closed, then
    killed after 30 s) when the block ends."""
    logs = run_dir / "logs"
    supervised: list[SupervisedProcess] = []
    stopping = anyio.Event()
    with ExitStack() as files:
        async with anyio.create_task_group() as tasks:
            for name in config.node_processes(learners=learners):
                if config.rank_of(name) != rank:
                    continue
                entry = _entry_point(config, run_dir, name, models, learners=learners)
                command = [sys.executable, "-m", *entry]
                command += ["--head", head]
                if config.cluster.keys:
                    command += ["--keys", config.cluster.keys]
                port = node_port(config, name)
                if port is not None and config.cluster.advertise:
                    command += ["--advertise", f"tcp://{config.cluster.advertise}:{port}"]
                fixed = listen if port is None else listen.replace(":*", f":{port}")
                command += ["--listen", fixed]
                node = SupervisedProcess(
                    name, command, open_append(files, logs / f"{_file_name(name)}.jsonl")
                )
                await node.start(tasks)
                supervised.append(node)
            after = config.cluster.hung_after
            hung = Hung(answering, after) if answering is not None and after > 0 else None
            for node in supervised:
                tasks.start_soon(node.keep_running, config.cluster.restarts, tasks, stopping, hung)
            try:
                yield
            finally:
                stopping.set()
                with anyio.CancelScope(shield=True):
                    await stop_node_processes([n.process for n in supervised if n.process])
                tasks.cancel_scope.cancel()


def node_port(config: RunConfig, name: str) -> int | None:
    """The port node ``name`` listens on in a multi-host run (``cluster.port``); None
    on one host, where each takes a free port on loopback. ``name`` is a node process
    or a worker host's own node (``rank-R``)."""
    if config.cluster.hosts == 1:
        return None
    processes = config.node_processes()
    if name.startswith("rank-"):
        return config.cluster.port + len(processes) + int(name.removeprefix("rank-"))
    return config.cluster.port + 1 + processes.index(name)


def _entry_point(
    config: RunConfig, run_dir: Path, name: str, models: dict[str, str], *, learners: bool
) -> list[str]:
    """The module and arguments that run node process ``name``; with ``learners`` an
    engine asks its policy's learner for the current weights once it serves."""
    kind, policy, *index = name.split("/")
    if kind == "engine":
        if policy == JUDGE_POLICY:
            engine, threads, max_batch = config.judge.engine, 1, 64
        else:
            settings = config.policies[policy]
            engine, threads, max_batch = settings.engine, settings.threads, settings.max_batch
        asks = ["--learner", f"learner/{policy}"] if learners and policy != JUDGE_POLICY else []
        return [
            *("actors.engines.serve", "--policy", policy, "--model", models[policy]),
            *("--index", index[0], "--engine", engine),
            *("--threads", str(threads), "--max-batch", str(max_batch), *asks),
        ]
    settings = config.policies[policy]
    learner = config.learner_config(
        policy,
        engines=[f"engine/{policy}/{i}" for i in range(settings.engines)],
        notify=["conductor"],
        checkpoint_dir=str(run_dir / "checkpoints" / policy),
        checkpoint_every=config.train.checkpoint_every,
        ledger=str(run_dir / "ledger" / learner_ledger(policy)),
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
