"""Runs over several hosts: addresses, Slurm's environment, and what a worker host
does.

Rank 0 is the head: it runs the conductor, the agents and the judge in the launcher's
own node, and starts the node processes ``cluster.placement`` leaves on rank 0. Every
other rank is a worker that starts the node processes placed on it, joined to the
head, and stops them when the head goes away. Models are read from the same path on
every host: a real checkpoint present on each, or, for the embedded model, the run
directory on a shared filesystem, where a worker waits for the head to finish
building it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from actors.processes import LOOPBACK, node_port, open_processes
from actors.run_config import EMBEDDED, JUDGE_POLICY, RunConfig
from runtime import open_node

HEAD_NODE = "head"


class ClusterError(RuntimeError):
    """A multi-host run cannot start or go on here; the message says why."""


def host_address(config: RunConfig) -> str:
    """The address other hosts reach this one at: ``cluster.interface``, else the
    first non-loopback IPv4 address of this host's name."""
    if config.cluster.interface:
        return config.cluster.interface
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET)
    except OSError as error:
        raise ClusterError(f"cannot resolve this host's name {name!r}: {error}") from None
    for *_, sockaddr in infos:
        address = str(sockaddr[0])
        if not address.startswith("127."):
            return address
    raise ClusterError(
        f"this host's name {name!r} resolves only to loopback; set cluster.interface to "
        "the address the other hosts reach it at"
    )


def head_listen(config: RunConfig) -> str:
    if config.cluster.hosts == 1:
        return LOOPBACK
    return f"tcp://{host_address(config)}:{config.cluster.port}"


def node_listen(config: RunConfig) -> str:
    """Where this host's node processes listen: ``*`` stands for the port each takes
    (``actors.processes.node_port``)."""
    if config.cluster.hosts == 1:
        return LOOPBACK
    return f"tcp://{host_address(config)}:*"


def advertised(config: RunConfig, port: int) -> str | None:
    """The address a node of this host listening on ``port`` registers, if not its
    listen address (``cluster.advertise``)."""
    if config.cluster.hosts == 1 or not config.cluster.advertise:
        return None
    return f"tcp://{config.cluster.advertise}:{port}"


@dataclass(frozen=True)
class SlurmTask:
    rank: int
    tasks: int
    head_host: str
    job_id: str


def slurm_task(environ: Mapping[str, str] = os.environ) -> SlurmTask | None:
    """This process's place in a Slurm job step (``srun``), or None outside one."""
    if "SLURM_PROCID" not in environ or "SLURM_JOB_NODELIST" not in environ:
        return None
    return SlurmTask(
        rank=int(environ["SLURM_PROCID"]),
        tasks=int(environ.get("SLURM_NTASKS", "1")),
        head_host=first_host(environ["SLURM_JOB_NODELIST"]),
        job_id=environ.get("SLURM_JOB_ID", "0"),
    )


_RANGE = re.compile(r"^([^\[,]*)\[([^\]]+)\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,9],cpu1`` gives ``gpu03``."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ClusterError("SLURM_JOB_NODELIST is empty")
    bracketed = _RANGE.match(nodelist)
    if bracketed is None:
        return nodelist.split(",", 1)[0]
    prefix, ranges = bracketed.groups()
    return prefix + ranges.split(",", 1)[0].split("-", 1)[0]


async def wait_for_models(config: RunConfig, run_dir: Path, rank: int) -> dict[str, str]:
    """The model path of every policy with a process on ``rank``; embedded ones appear
    in the shared run directory when the head has built them (it renames each into
    place whole), so a worker waits up to ``cluster.join_timeout`` for them."""
    needed = {
        name.split("/")[1]
        for name in config.node_processes()
        if config.rank_of(name) == rank and name.split("/")[1] in config.policies
    }
    paths = {}
    for policy in sorted(needed):
        model = config.policies[policy].model
        path = run_dir / "models" / policy if model == EMBEDDED else Path(model)
        with anyio.move_on_after(config.cluster.join_timeout) as waited:
            await poll_until(path.is_dir)
        if waited.cancelled_caught:
            raise ClusterError(
                f"policy {policy!r}: {path} did not appear within {config.cluster.join_timeout} s"
                + (
                    " (is the run directory on a filesystem the head shares?)"
                    if model == EMBEDDED
                    else ""
                )
            )
        paths[policy] = str(path)
    if config.judge.kind == "llm":
        paths[JUDGE_POLICY] = config.judge.model
    return paths


async def serve_worker(config: RunConfig, run_dir: Path, head: str, rank: int) -> None:
    """Start the node processes placed on ``rank``, joined to ``head``, and stop them
    once the head has gone away (its run ended, or it died: then after the runtime's
    heartbeat timeout)."""
    if not 0 < rank < config.cluster.hosts:
        raise ClusterError(f"--rank {rank}: a worker's rank is in 1..{config.cluster.hosts - 1}")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    models = await wait_for_models(config, run_dir, rank)
    listen = node_listen(config)
    name = f"rank-{rank}"
    port = node_port(config, name)
    assert port is not None, "a worker host is one of several"
    async with open_node(
        name,
        listen=listen.replace(":*", f":{port}"),
        head=head,
        keys=config.cluster_keys(),
        advertise=advertised(config, port),
    ) as node:
        with anyio.move_on_after(config.cluster.join_timeout) as waited:
            await poll_until(lambda: node.peer_is_up(HEAD_NODE))
        if waited.cancelled_caught:
            raise ClusterError(
                f"no answer from the head at {head} in {config.cluster.join_timeout} s"
            )
        async with open_processes(
            config, run_dir, head, models, learners=True, rank=rank, listen=listen
        ):
            print(f"rank {rank}: serving {_placed(config, rank)} for {head}", flush=True)
            await poll_until(lambda: not node.peer_is_up(HEAD_NODE))
    print(f"rank {rank}: the head is gone; stopped", flush=True)


async def poll_until(condition: Callable[[], bool], interval: float = 0.5) -> None:
    """Wait until ``condition()`` holds: for states no event announces (a file another
    host writes, a link the runtime's heartbeats keep up)."""
    while True:
        if condition():
            return
        await anyio.sleep(interval)


def _placed(config: RunConfig, rank: int) -> list[str]:
    return [name for name in config.node_processes() if config.rank_of(name) == rank]
