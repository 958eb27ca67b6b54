"""The sandbox runs model-written code and reports every way it can end as a result.

These tests start real interpreters (about 50 ms each). Isolation is asserted where the
tests run as root, which is where relaytrain's workers run; a non-root run checks the
behaviour that does not depend on it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from rewards.sandbox import SandboxLimits, SandboxResult, extract_code, run_python

ROOT = os.geteuid() == 0
FAST = SandboxLimits(wall_seconds=10)


def program(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A root-owned directory the sandbox's uid can enter (pytest's tmp_path sits in a
    directory only its owner can)."""
    path = Path(tempfile.mkdtemp(prefix="relaytrain-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def is_gone(pid: int) -> bool:
    """Whether a process has ended (a zombie waiting for init to reap it has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


@pytest.mark.anyio
async def test_prints_come_back() -> None:
    result = await run_python("print(6 * 7)\nprint('done')", FAST)
    assert result.ok
    assert result.stdout == "42\ndone\n"
    assert (result.exit_code, result.killed_reason, result.timed_out) == (0, "", False)
    assert result.observation() == "42\ndone"


@pytest.mark.anyio
async def test_silent_success_says_so() -> None:
    result = await run_python("x = 1", FAST)
    assert result.observation() == "(no output)"


@pytest.mark.anyio
async def test_exception_gives_the_traceback() -> None:
    result = await run_python("print('before')\n1 / 0", FAST)
    assert (result.exit_code, result.killed_reason) == (1, "")
    observation = result.observation()
    assert observation.startswith("before\nTraceback (most recent call last):\n")
    assert 'File "main.py", line 2' in observation
    assert "ZeroDivisionError: division by zero" in observation
    assert observation.endswith("Exited with status 1.")


@pytest.mark.anyio
async def test_infinite_loop_is_stopped_by_the_timeout() -> None:
    code = "print('started', flush=True)\nwhile True:\n    pass"
    result = await run_python(code, SandboxLimits(wall_seconds=0.5))
    assert result.timed_out
    assert result.killed_reason == "timeout"
    assert 0.5 <= result.duration_s < 3
    assert result.stdout == "started\n"
    assert result.observation() == "started\nTimed out: stopped after 0.5 s."


@pytest.mark.slow
@pytest.mark.anyio
async def test_cpu_limit_stops_a_busy_loop() -> None:
    result = await run_python("while True:\n    pass", SandboxLimits(cpu_seconds=1))
    assert result.killed_reason == "cpu"
    assert not result.timed_out
    assert result.observation() == "Stopped: the CPU time limit was exceeded."


@pytest.mark.anyio
async def test_memory_hog_is_stopped() -> None:
    code = "hog = []\nwhile True:\n    hog.append(bytearray(10**7))"
    result = await run_python(code, SandboxLimits(memory_bytes=200 * 2**20, wall_seconds=10))
    assert result.killed_reason == "memory"
    assert "MemoryError" in result.stderr
    assert result.observation().endswith("Stopped: the memory limit was exceeded.")


@pytest.mark.anyio
async def test_output_flood_is_capped() -> None:
    code = "while True:\n    print('x' * 100)"
    result = await run_python(code, SandboxLimits(output_bytes=1000, wall_seconds=10))
    assert result.killed_reason == "output"
    assert result.exit_code == -9
    assert len(result.stdout) == 1000
    assert result.observation().endswith("passed the size limit and was cut off.")


@pytest.mark.anyio
async def test_stderr_flood_is_capped() -> None:
    code = "import sys\nwhile True:\n    sys.stderr.write('e' * 100)"
    result = await run_python(code, SandboxLimits(output_bytes=1000, wall_seconds=10))
    assert result.killed_reason == "output"
    assert len(result.stderr) == 1000


@pytest.mark.anyio
async def test_sockets_cannot_connect() -> None:
    code = program(
        """
        import socket
        for address in [("127.0.0.1", 22), ("1.1.1.1", 53)]:
            try:
                socket.create_connection(address, timeout=2).close()
                print("connected", address[0])
            except OSError as error:
                print("refused", address[0], error.errno)
        """
    )
    result = await run_python(code, FAST)
    if ROOT:
        assert result.network_isolated
    if result.network_isolated:
        assert "connected" not in result.stdout
        assert result.stdout.count("refused") == 2


@pytest.mark.skipif(not ROOT, reason="the process limit needs a dedicated uid, so root")
@pytest.mark.anyio
async def test_fork_bomb_is_stopped() -> None:
    code = program(
        """
        import os
        while True:
            os.fork()
        """
    )
    started = time.monotonic()
    result = await run_python(code, SandboxLimits(processes=8, wall_seconds=10))
    assert time.monotonic() - started < 5
    assert result.user_isolated
    assert "BlockingIOError" in result.stderr
    assert not result.ok


@pytest.mark.skipif(not ROOT, reason="the process limit needs a dedicated uid, so root")
@pytest.mark.anyio
async def test_process_limit_counts_every_process() -> None:
    code = program(
        """
        import os, time
        children = []
        try:
            while len(children) < 100:
                child = os.fork()
                if child == 0:
                    time.sleep(60)
                    os._exit(0)
                children.append(child)
        except BlockingIOError:
            pass
        print(len(children), *children)
        """
    )
    result = await run_python(code, SandboxLimits(processes=6, wall_seconds=10))
    count, *children = (int(word) for word in result.stdout.split())
    assert count == 5
    assert result.ok
    assert all(is_gone(child) for child in children)


@pytest.mark.anyio
async def test_processes_left_behind_are_killed() -> None:
    code = program(
        """
        import os, time
        child = os.fork()
        if child == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        print(child)
        """
    )
    result = await run_python(code, FAST)
    assert result.ok
    assert result.duration_s < 5
    if ROOT:
        assert is_gone(int(result.stdout))


@pytest.mark.anyio
async def test_huge_file_is_stopped() -> None:
    code = program(
        """
        import os
        try:
            with open("big", "wb") as file:
                for _ in range(100):
                    file.write(b"x" * 2**20)
        except OSError as error:
            print(error.strerror)
        print(os.path.getsize("big"))
        """
    )
    result = await run_python(code, SandboxLimits(file_bytes=2**20, wall_seconds=10))
    message, size = result.stdout.splitlines()
    assert message == "File too large"
    assert int(size) <= 2**20


@pytest.mark.anyio
async def test_working_directory_is_fresh_and_removed() -> None:
    code = "import os\nprint(os.getcwd())\nprint(os.listdir('.'))\nopen('left', 'w').close()"
    first = await run_python(code, FAST)
    second = await run_python(code, FAST)
    first_dir, listing = first.stdout.splitlines()
    assert listing == "['main.py']"
    assert first_dir != second.stdout.splitlines()[0]
    assert not await anyio.Path(first_dir).exists()
    assert not await anyio.Path(second.stdout.splitlines()[0]).exists()


@pytest.mark.anyio
async def test_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYTRAIN_SECRET_TOKEN", "hunter2")
    result = await run_python("import os\nprint(sorted(os.environ))", FAST)
    assert result.stdout.strip() == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"


@pytest.mark.skipif(not ROOT, reason="a dedicated uid needs root")
@pytest.mark.anyio
async def test_host_files_are_not_writable(open_dir: Path) -> None:
    code = f"open({str(open_dir / 'planted')!r}, 'w')"
    result = await run_python(code, FAST)
    assert result.user_isolated
    assert "PermissionError: [Errno 13] Permission denied" in result.stderr
    assert not (open_dir / "planted").exists()


@pytest.mark.slow
@pytest.mark.anyio
async def test_cancelling_the_caller_kills_the_program(open_dir: Path) -> None:
    report = anyio.Path(open_dir, "report")
    await report.parent.chmod(0o777)
    code = program(
        f"""
        import os
        with open({str(report)!r}, "w") as file:
            file.write(f"{{os.getpid()}} {{os.getcwd()}}")
        while True:
            pass
        """
    )
    with anyio.move_on_after(1) as scope:
        await run_python(code, FAST)
    assert scope.cancelled_caught
    pid, workdir = (await report.read_text()).split()
    assert is_gone(int(pid))
    assert not await anyio.Path(workdir).exists()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"SandboxLimits\.wall_seconds must be positive, got 0"):
        SandboxLimits(wall_seconds=0)


def test_signal_observation_names_the_signal() -> None:
    result = SandboxResult(
        stdout="",
        stderr="",
        exit_code=-11,
        timed_out=False,
        killed_reason="signal",
        duration_s=0.1,
        network_isolated=True,
        user_isolated=True,
    )
    assert result.observation() == "Killed by signal SIGSEGV."


def test_extract_code_takes_the_last_python_block() -> None:
    text = "First:\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```bash\nls\n```\n"
    assert extract_code(text) == "print(2)\n"


def test_extract_code_falls_back_to_a_bare_fence() -> None:
    assert extract_code("```\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)\n"
    assert extract_code("```\nbare\n```\n```python\nlabelled\n```\n```\nlater\n```") == (
        "labelled\n"
    )


def test_extract_code_dedents_an_indented_fence() -> None:
    text = "1. Run:\n   ```python\n   for i in range(2):\n       print(i)\n   ```"
    assert extract_code(text) == "for i in range(2):\n    print(i)\n"


def test_extract_code_ignores_open_fences_and_other_languages() -> None:
    assert extract_code("no code here") is None
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("```python\nprint(1)\n```\n```python\nprint(2") == "print(1)\n"
    assert extract_code("```python\n\n```") is None
