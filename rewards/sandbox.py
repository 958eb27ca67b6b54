"""Run untrusted, model-written Python and turn what happened into an observation.

MAPPA's Code Executor runs the Python a model wrote, with a 30 s timeout, and shows the
result to the next agent and to the judge. ``run_python`` is that executor. A timeout, a
crash or a limit hit is part of the result (``SandboxResult.observation()`` describes it),
never an exception: the model's code failing is the expected case, not the caller's.

How the child is confined (Linux). A short bootstrap interpreter, started in a new
session, does the following and then replaces itself with ``python -I -S -u main.py``,
run in a fresh directory with a minimal environment (the standard library only, no
site-packages):

* network: ``unshare(CLONE_NEWNET)`` gives it a network namespace of its own whose only
  interface, loopback, is down, so every connect fails, 127.0.0.1 included. Without
  CAP_SYS_ADMIN it tries ``CLONE_NEWUSER | CLONE_NEWNET`` instead.
  ``SandboxResult.network_isolated`` says whether either worked.
* user: run as root, it switches to a uid of its own (``SANDBOX_UID_BASE`` + its pid).
  That is what makes the limits binding: the kernel never applies RLIMIT_NPROC to uid 0,
  and root (CAP_SYS_RESOURCE) may raise its own limits again. The dedicated uid also
  cannot write the host's files, and after the run every process it owns is killed, even
  one that left the process group with ``setsid``. ``SandboxResult.user_isolated`` says
  whether this happened; a non-root caller runs the child as itself. The dedicated uid
  must be able to run the interpreter, so when the caller's is not open to other users
  (one under a 0700 /root, say) the program runs under the system's ``python3``.
* limits: rlimits on CPU seconds per process, address space, file size, core dumps (none)
  and, under the dedicated uid only, the number of processes.

The parent reads at most ``output_bytes`` of each of stdout and stderr and kills the
child beyond that; it kills the process group (and the dedicated uid's processes) at the
wall-clock deadline, when the main process exits, and when the caller is cancelled; and
it removes the directory afterwards.

Not confined: the file system is shared, so the program can read world-readable files
and write world-writable places such as /tmp (each file capped at ``file_bytes``).
There is no system-call filter.

The bootstrap is a separate interpreter rather than a ``preexec_fn`` because
``anyio.open_process`` takes none, and because ``preexec_fn`` is unsafe in a process
with threads (pyzmq's I/O threads, trio's worker threads): the forked child can deadlock
on a lock another thread held. It costs one interpreter start. The child runs under
``anyio.open_process`` rather than ``subprocess`` in a worker thread because reading two
capped pipes, waiting for the exit and keeping a deadline are concurrent waits that a
task group expresses directly, and cancelling the caller then kills the child.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import textwrap
import time
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from subprocess import DEVNULL
from typing import Literal

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, Process

SANDBOX_UID_BASE = 1 << 30
"""A child run as root takes the uid ``SANDBOX_UID_BASE + pid``: unique while it runs,
and far above the uids that accounts and container id maps use."""

KilledReason = Literal["", "timeout", "cpu", "memory", "output", "signal"]

_HEADER_SIZE = 2
_KILL_ROUNDS_S = 5.0
_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
_PYTHON_LANGUAGES = {"python", "python3", "py"}

_BOOTSTRAP = r"""
import ctypes, os, resource, sys

uid_base, cpu, memory, file_size, processes = (int(arg) for arg in sys.argv[1:6])
python = sys.argv[6]
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


def limit(kind, soft, hard):
    ceiling = resource.getrlimit(kind)[1]
    if ceiling != resource.RLIM_INFINITY:
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(kind, (soft, hard))


network = libc.unshare(CLONE_NEWNET) == 0
user = False
if uid_base >= 0:
    uid = uid_base + os.getpid()
    try:
        os.chown(".", uid, uid)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        user = True
    except OSError:
        pass
if not network:
    network = libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
limit(resource.RLIMIT_CORE, 0, 0)
limit(resource.RLIMIT_CPU, cpu, cpu + 1)
limit(resource.RLIMIT_AS, memory, memory)
limit(resource.RLIMIT_FSIZE, file_size, file_size)
if user:
    limit(resource.RLIMIT_NPROC, processes, processes)
os.write(1, b"%d%d" % (network, user))
os.execv(python, [python, "-I", "-S", "-u", "main.py"])
"""


class SandboxLimits(msgspec.Struct, frozen=True):
    """What one run may use. ``cpu_seconds`` bounds each process's CPU time and
    ``wall_seconds`` the whole run (MAPPA's executor allows 30 s). ``memory_bytes`` is
    each process's address space (the interpreter starts within 16 MiB).
    ``output_bytes`` bounds each of stdout and stderr; ``file_bytes`` any one file
    written; ``processes`` how many processes and threads the program may have at once,
    itself included."""

    cpu_seconds: int = 30
    wall_seconds: float = 30.0
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 64 * 2**10
    file_bytes: int = 16 * 2**20
    processes: int = 16

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")


DEFAULT_LIMITS = SandboxLimits()


class SandboxResult(msgspec.Struct, frozen=True):
    """How one run ended. ``exit_code`` is negative for a signal (``-9``: killed).
    ``killed_reason`` names the limit that stopped the program: ``timeout`` (wall
    clock), ``cpu``, ``memory`` (it died of ``MemoryError``), ``output`` (stdout or
    stderr passed ``output_bytes``; what came before is kept), ``signal`` (another
    signal), or "" when it ended by itself. ``network_isolated`` and ``user_isolated``
    say which confinements actually held (see the module docstring). A traceback names
    the program's file ``main.py``, whatever directory it ran in, so the same code gives
    the same observation."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    killed_reason: KilledReason
    duration_s: float
    network_isolated: bool
    user_isolated: bool

    @property
    def ok(self) -> bool:
        """The program ran to the end and exited with status 0."""
        return self.exit_code == 0 and not self.killed_reason

    def observation(self) -> str:
        """The text an agent or judge sees: stdout when the program succeeded; otherwise
        stdout, stderr (the traceback) and a line saying how it ended."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.ok:
            return "\n".join(parts) if parts else "(no output)"
        if self.stderr.strip():
            parts.append(self.stderr.rstrip("\n"))
        parts.append(self._ending())
        return "\n".join(parts)

    def _ending(self) -> str:
        if self.killed_reason == "timeout":
            return f"Timed out: stopped after {self.duration_s:.1f} s."
        if self.killed_reason == "cpu":
            return "Stopped: the CPU time limit was exceeded."
        if self.killed_reason == "memory":
            return "Stopped: the memory limit was exceeded."
        if self.killed_reason == "output":
            return "Stopped: the output passed the size limit and was cut off."
        if self.exit_code < 0:
            return f"Killed by signal {_signal_name(-self.exit_code)}."
        return f"Exited with status {self.exit_code}."


async def run_python(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox and wait for it to end, for at
    most ``limits.wall_seconds``. Cancelling the call kills the program."""
    workdir = await anyio.mkdtemp(prefix="relaytrain-sandbox-")
    try:
        await anyio.Path(workdir, "main.py").write_text(code, encoding="utf-8")
        return await _run(workdir, limits)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove_tree, workdir)


def extract_code(text: str) -> str | None:
    """The code of the last fenced ```python block in a model's output, or of the last
    fence without a language when there is no python one; None when there is neither.

    A fence left open (a completion cut off by its token limit) is not code to run."""
    found: dict[bool, str] = {}
    language: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        fence = line.strip()
        if not fence.startswith("```"):
            if language is not None:
                lines.append(line)
        elif language is None or fence != "```":
            language = fence[3:].strip().split(" ")[0].lower()
            lines = []
        else:
            body = textwrap.dedent("\n".join(lines)).strip("\n")
            if body.strip() and (language in _PYTHON_LANGUAGES or not language):
                found[bool(language)] = body + "\n"
            language = None
    return found.get(True, found.get(False))


@dataclass
class _Capture:
    """One pipe's bytes, up to ``limit``, after a ``header_size``-byte header."""

    limit: int
    header_size: int = 0
    header: bytearray = field(default_factory=bytearray)
    data: bytearray = field(default_factory=bytearray)
    overflowed: bool = False

    def feed(self, chunk: bytes) -> None:
        missing = self.header_size - len(self.header)
        if missing > 0:
            self.header += chunk[:missing]
            chunk = chunk[missing:]
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        if len(chunk) > room:
            self.overflowed = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class _Child:
    """A started child and whether every process of it is known dead."""

    process: Process
    uid: int | None
    finished_at: float | None = None
    cleaned: bool = False

    async def wait_exit(self) -> None:
        """Wait for the main process, then kill what it left behind, so the pipes
        those processes hold close and the readers see the end."""
        await self.process.wait()
        self.finished_at = time.monotonic()
        await self.kill()

    async def kill(self) -> None:
        await anyio.to_thread.run_sync(_kill_all, self.process.pid, self.uid)
        self.cleaned = True


async def _run(workdir: str, limits: SandboxLimits) -> SandboxResult:
    python, uid_base = _plan()
    stdout = _Capture(limits.output_bytes, header_size=_HEADER_SIZE)
    stderr = _Capture(limits.output_bytes)
    command = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _BOOTSTRAP,
        str(uid_base if uid_base is not None else -1),
        str(limits.cpu_seconds),
        str(limits.memory_bytes),
        str(limits.file_bytes),
        str(limits.processes),
        python,
    ]
    process = await anyio.open_process(
        command,
        stdin=DEVNULL,
        cwd=workdir,
        env=_environment(workdir),
        start_new_session=True,
    )
    started = time.monotonic()
    child = _Child(process, None if uid_base is None else uid_base + process.pid)
    assert process.stdout is not None and process.stderr is not None
    try:
        with anyio.move_on_after(limits.wall_seconds) as deadline:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_drain, process.stdout, stdout, tasks.cancel_scope)
                tasks.start_soon(_drain, process.stderr, stderr, tasks.cancel_scope)
                tasks.start_soon(child.wait_exit)
        stopped = time.monotonic()
    finally:
        with anyio.CancelScope(shield=True):
            if not child.cleaned:
                await child.kill()
            await process.aclose()
    ended = child.finished_at if child.finished_at is not None else stopped
    exit_code = process.returncode if process.returncode is not None else -signal.SIGKILL
    timed_out = deadline.cancelled_caught
    overflowed = stdout.overflowed or stderr.overflowed
    traceback = stderr.text().replace(f'File "{workdir}/main.py"', 'File "main.py"')
    return SandboxResult(
        stdout=stdout.text(),
        stderr=traceback,
        exit_code=exit_code,
        timed_out=timed_out,
        killed_reason=_killed_reason(exit_code, traceback, timed_out, overflowed),
        duration_s=ended - started,
        network_isolated=stdout.header[:1] == b"1",
        user_isolated=stdout.header[1:2] == b"1",
    )


async def _drain(stream: ByteReceiveStream, capture: _Capture, run: anyio.CancelScope) -> None:
    """Read ``stream`` into ``capture`` to its end; past the limit, stop the run."""
    async for chunk in stream:
        capture.feed(chunk)
        if capture.overflowed:
            run.cancel()
            return


def _killed_reason(exit_code: int, stderr: str, timed_out: bool, overflowed: bool) -> KilledReason:
    if timed_out:
        return "timeout"
    if overflowed:
        return "output"
    if exit_code == -signal.SIGXCPU:
        return "cpu"
    if exit_code < 0:
        return "signal"
    last_line = stderr.rstrip().rpartition("\n")[2]
    if exit_code != 0 and last_line.startswith("MemoryError"):
        return "memory"
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _environment(workdir: str) -> dict[str, str]:
    """Nothing of the caller's environment (tokens, proxies) reaches the program."""
    return {
        "PATH": _SEARCH_PATH,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


@cache
def _plan() -> tuple[str, int | None]:
    """The interpreter the program runs under, and the uid base when the child should
    switch to a dedicated uid (as root). The dedicated uid must be able to run the
    interpreter: ``sys.executable`` when it and its standard library are open to other
    users, else the system's ``python3``. With neither, the child stays root."""
    if os.geteuid() != 0:
        return sys.executable, None
    if _open_to_others(sys.executable) and _open_to_others(os.path.dirname(os.__file__)):
        return sys.executable, SANDBOX_UID_BASE
    system_python = shutil.which("python3", path=_SEARCH_PATH)
    if system_python is not None and _open_to_others(system_python):
        return system_python, SANDBOX_UID_BASE
    return sys.executable, None


def _open_to_others(path: str) -> bool:
    """Whether a user who owns nothing can reach ``path`` and execute or enter it."""
    target = Path(path).resolve()
    return all(os.stat(place).st_mode & stat.S_IXOTH for place in (target, *target.parents))


def _kill_all(pid: int, uid: int | None) -> None:
    """SIGKILL the child's process group and, with a dedicated uid, every process of
    that uid (a process that called ``setsid`` left the group). Rounds repeat until a
    scan finds none alive: a process forked between a scan and its kill is found by the
    next one, and the process limit bounds how many there can be. A process the kernel
    cannot kill (stuck in an uninterruptible wait) ends the rounds after a few seconds."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if uid is None:
        return
    give_up = time.monotonic() + _KILL_ROUNDS_S
    while (survivors := _processes_of(uid)) and time.monotonic() < give_up:
        for survivor in survivors:
            with suppress(ProcessLookupError):
                os.kill(survivor, signal.SIGKILL)


def _processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        real_uid = fields.get("Uid", "").split()[:1]
        if real_uid == [str(uid)] and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry.name))
    return found


def _remove_tree(path: str) -> None:
    """Remove the run's directory, including directories the program made unreadable
    (which only matters when it ran as the caller's own user)."""
    with suppress(FileNotFoundError):
        os.chmod(path, 0o700)
        for root, directories, _ in os.walk(path):
            for name in directories:
                inner = os.path.join(root, name)
                if not os.path.islink(inner):
                    os.chmod(inner, 0o700)
        shutil.rmtree(path)


__all__ = [
    "DEFAULT_LIMITS",
    "SANDBOX_UID_BASE",
    "KilledReason",
    "SandboxLimits",
    "SandboxResult",
    "extract_code",
    "run_python",
]
