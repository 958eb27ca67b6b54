"""The launcher's supervision of node processes, with stand-in processes that print a
ready line and exit or hang: each death starts the process again, listening where it
did, until the restarts allowed are spent; one that stops answering is killed first."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import pytest

from actors.processes import Hung, NodeProcessFailed, SupervisedProcess

pytestmark = pytest.mark.anyio

# Prints a ready line naming the address it was told to listen on (a port of its own
# when told "*"), then records its arguments and exits after a moment.
SERVES_THEN_DIES = """
import json, sys, time
listen = sys.argv[-1].replace("*", "40001")
print(json.dumps({"ready": listen, "name": "engine/p/0"}), flush=True)
with open(sys.argv[1], "a") as log:
    log.write(" ".join(sys.argv[2:]) + "\\n")
time.sleep(0.1)
"""


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[IO[bytes]]:
    with open(tmp_path / "log", "ab") as file:
        yield file


async def test_a_dead_node_process_starts_again_where_it_listened_until_restarts_run_out(
    tmp_path: Path, log: IO[bytes]
) -> None:
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", SERVES_THEN_DIES, str(starts)]
    command += ["--listen", "tcp://127.0.0.1:*"]
    node = SupervisedProcess("engine/p/0", command, log)
    failed = pytest.RaisesExc(NodeProcessFailed, match=r"engine/p/0 exited with 0 after 2 rest")
    with pytest.RaisesGroup(failed):
        async with anyio.create_task_group() as tasks:
            await node.start(tasks)
            await node.keep_running(2, tasks, anyio.Event())
    assert starts.read_text().splitlines() == [
        "--listen tcp://127.0.0.1:*",
        "--listen tcp://127.0.0.1:40001",
        "--listen tcp://127.0.0.1:40001",
    ]


async def test_a_node_process_is_not_started_again_once_the_run_stops(
    tmp_path: Path, log: IO[bytes]
) -> None:
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", SERVES_THEN_DIES, str(starts), "--listen", "tcp://a:1"]
    stopping = anyio.Event()
    stopping.set()
    node = SupervisedProcess("learner/p", command, log)
    async with anyio.create_task_group() as tasks:
        await node.start(tasks)
        await node.keep_running(3, tasks, stopping)
    assert starts.read_text().splitlines() == ["--listen tcp://a:1"]


async def test_a_node_process_that_dies_before_serving_is_named(log: IO[bytes]) -> None:
    command = [sys.executable, "-c", "raise SystemExit(3)", "--listen", "tcp://a:1"]
    node = SupervisedProcess("engine/p/0", command, log)
    failed = pytest.RaisesExc(NodeProcessFailed, match=r"engine/p/0 exited with 3 before it")
    with pytest.RaisesGroup(failed):
        async with anyio.create_task_group() as tasks:
            await node.start(tasks)


# Prints a ready line, records that it started, then hangs.
SERVES_THEN_HANGS = """
import json, sys, time
print(json.dumps({"ready": sys.argv[-1]}), flush=True)
with open(sys.argv[1], "a") as log:
    log.write("started\\n")
time.sleep(60)
"""


async def test_a_node_process_that_stops_answering_is_killed_and_started_again(
    tmp_path: Path, log: IO[bytes]
) -> None:
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", SERVES_THEN_HANGS, str(starts), "--listen", "tcp://a:1"]
    node = SupervisedProcess("engine/p/0", command, log)
    never = Hung(answering=lambda name: False, after=0.2)
    failed = pytest.RaisesExc(NodeProcessFailed, match=r"engine/p/0 exited with -9 after 1 rest")
    with anyio.fail_after(30), pytest.RaisesGroup(failed):
        async with anyio.create_task_group() as tasks:
            await node.start(tasks)
            await node.keep_running(1, tasks, anyio.Event(), never)
    assert starts.read_text().splitlines() == ["started", "started"]


async def test_a_node_process_that_answers_is_left_to_run(tmp_path: Path, log: IO[bytes]) -> None:
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", SERVES_THEN_DIES, str(starts), "--listen", "tcp://a:1"]
    node = SupervisedProcess("engine/p/0", command, log)
    always = Hung(answering=lambda name: name == "engine/p/0", after=0.02)
    failed = pytest.RaisesExc(NodeProcessFailed, match=r"engine/p/0 exited with 0 after 0 rest")
    with pytest.RaisesGroup(failed):
        async with anyio.create_task_group() as tasks:
            await node.start(tasks)
            await node.keep_running(0, tasks, anyio.Event(), always)
