"""A two-host run with the hosts in network namespaces of their own, every link between
them through a fault-injecting proxy in the root namespace that stalls, resets and
partitions the links at random: the run ends at its target and its ledger shows no
segment lost or trained twice.

Each host advertises the root namespace's address on the other host's side
(``cluster.advertise``), and its nodes listen on the fixed ports that follow
``cluster.port``, so one proxy a port, set up before the run, carries every link:

    head namespace 10.77.1.2 --veth-- root 10.77.1.1 | 10.77.2.1 --veth-- 10.77.2.2 worker
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from actors.ledger import audit
from actors.run_config import load_config
from tests.fault_proxy import FaultProxy, inject_randomly
from tests.test_launch import ROOT, SHARED, short_recipe

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

HEAD, WORKER = "10.77.1.2", "10.77.2.2"
ROOT_ON_HEAD_SIDE, ROOT_ON_WORKER_SIDE = "10.77.1.1", "10.77.2.1"
PORT = 29600


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    """Two namespaces joined to the root namespace by a veth pair each."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = os.getpid() % 100000
    head, worker = f"rth{tag}", f"rtw{tag}"
    made: list[str] = []
    try:
        for name, inside, outside in (
            (head, HEAD, ROOT_ON_HEAD_SIDE),
            (worker, WORKER, ROOT_ON_WORKER_SIDE),
        ):
            ip("netns", "add", name)
            made.append(name)
            ip("link", "add", f"{name}o", "type", "veth", "peer", "name", f"{name}i")
            ip("link", "set", f"{name}i", "netns", name)
            ip("addr", "add", f"{outside}/24", "dev", f"{name}o")
            ip("link", "set", f"{name}o", "up")
            ip("-n", name, "addr", "add", f"{inside}/24", "dev", f"{name}i")
            ip("-n", name, "link", "set", f"{name}i", "up")
            ip("-n", name, "link", "set", "lo", "up")
            ip("-n", name, "route", "add", "default", "via", outside)
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        for name in made:
            ip("netns", "del", name)
        pytest.skip(f"cannot make network namespaces here: {error}")
    try:
        yield head, worker
    finally:
        for name in made:
            ip("netns", "del", name)


async def test_a_run_across_two_namespaces_survives_link_trouble(
    namespaces: tuple[str, str], tmp_path: Path
) -> None:
    head_ns, worker_ns = namespaces
    keys = tmp_path / "keys"
    await anyio.run_process([sys.executable, "-m", "actors.launch", "keys", str(keys)], cwd=ROOT)
    settings = [
        f"runs_dir='{tmp_path}'",
        "cluster.hosts=2",
        f"cluster.keys='{keys}'",
        f"cluster.port={PORT}",
        "cluster.placement={'engine/team/0' = 1}",
        *short_recipe(30),
    ]
    config = load_config(SHARED, settings)
    processes = config.node_processes()
    worker_ports = {PORT + 1 + processes.index("engine/team/0"), PORT + len(processes) + 1}
    head_ports = {PORT, PORT + 1 + processes.index("learner/team")}
    proxies = [FaultProxy((HEAD, port)) for port in sorted(head_ports)]
    proxies += [FaultProxy((WORKER, port)) for port in sorted(worker_ports)]
    listens = [(ROOT_ON_WORKER_SIDE, p) for p in sorted(head_ports)]
    listens += [(ROOT_ON_HEAD_SIDE, p) for p in sorted(worker_ports)]

    def host(namespace: str, address: str, advertise: str) -> list[str]:
        per_host = [f"cluster.interface='{address}'", f"cluster.advertise='{advertise}'"]
        return [
            *("ip", "netns", "exec", namespace, sys.executable, "-m", "actors.launch", str(SHARED)),
            *(f"--set={s}" for s in [*settings, *per_host]),
        ]

    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "head"}
    run_dir = tmp_path / "marsrl-tiny-shared-slurm77"
    join = ["--join", f"tcp://{ROOT_ON_WORKER_SIDE}:{PORT}", "--rank", "1"]
    done: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def run(name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        done[name] = await anyio.run_process(command, cwd=ROOT, env=env, check=False)

    with anyio.fail_after(900):
        async with anyio.create_task_group() as tasks:
            for proxy, (address, port) in zip(proxies, listens, strict=True):
                await tasks.start(proxy.serve, address, port)
            for seed, proxy in enumerate(proxies):
                trouble = functools.partial(
                    inject_randomly, proxy, every=3.0, seed=seed, duration=(0.5, 2.0)
                )
                tasks.start_soon(trouble)
            async with anyio.create_task_group() as hosts:
                head_env = {**os.environ, **slurm, "SLURM_JOB_ID": "77"}
                hosts.start_soon(run, "head", host(head_ns, HEAD, ROOT_ON_WORKER_SIDE), head_env)
                worker = host(worker_ns, WORKER, ROOT_ON_HEAD_SIDE)
                hosts.start_soon(run, "worker", [*worker, *join, "--run-dir", str(run_dir)])
            tasks.cancel_scope.cancel()
    for name, result in done.items():
        output = result.stdout.decode()[-2000:] + result.stderr.decode()[-3000:]
        assert result.returncode == 0, f"{name}: {output}"
    assert b"after 30 RL batches" in done["head"].stdout
    faults = sum(sum(p.counts[k] for k in ("stalls", "resets", "partitions")) for p in proxies)
    # The worker's nodes dial the head's: every link carries their connections (a
    # node answers over the connection its peer dialed).
    carried = {proxy.upstream[1]: proxy.counts["connections"] for proxy in proxies}
    assert faults >= 4 and all(carried[port] > 1 for port in head_ports), carried
    ledger = audit(run_dir / "ledger")
    assert ledger.clean, (ledger.problems, ledger.learners)
    assert ledger.learners["team"].batches >= 30
