"""OTP-style supervision of the actors (and supervisors) of one node.

A supervisor restarts children that crash, by strategy:

* ``one_for_one``: only the child that crashed;
* ``one_for_all``: every child (the others are stopped first, in reverse start order);
* ``rest_for_one``: the child that crashed and every child started after it.

If more than ``intensity`` restarts happen within ``period`` seconds, the supervisor
stops all its children and fails with ``SupervisionEscalated``; its own supervisor then
treats that as a crash of a child. The node's root supervisor escalating ends the node.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Literal, Protocol

import anyio
import anyio.abc

from ._cell import ActorCrashed
from ._errors import SupervisionEscalated, first_leaf

if TYPE_CHECKING:
    from ._node import Node

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]


class _Runnable(Protocol):
    name: str
    restarts: int

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = ...) -> None: ...


class _Child:
    __slots__ = ("done", "scope", "target")

    def __init__(self, target: _Runnable) -> None:
        self.target = target
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()


class Supervisor:
    def __init__(
        self,
        node: Node,
        name: str,
        *,
        strategy: Strategy = "one_for_one",
        intensity: int = 3,
        period: float = 5.0,
    ) -> None:
        if strategy not in ("one_for_one", "one_for_all", "rest_for_one"):
            raise ValueError(f"unknown supervision strategy {strategy!r}")
        if intensity < 0 or period <= 0:
            raise ValueError(f"supervisor {name!r}: need intensity >= 0 and period > 0")
        self.node = node
        self.name = name
        self.strategy = strategy
        self.intensity = intensity
        self.period = period
        self.restarts = 0
        self._children: list[_Child] = []
        self._history: deque[float] = deque()
        self._lock = anyio.Lock()
        self._tasks: anyio.abc.TaskGroup | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Supervise until cancelled or escalated."""
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                for child in list(self._children):
                    await tasks.start(self._run_child, child)
                task_status.started()
                await anyio.sleep_forever()
        except BaseExceptionGroup as group:
            escalated = first_leaf(group, SupervisionEscalated)
            if escalated is None:
                raise
            raise escalated from None
        finally:
            self._tasks = None

    async def start_child(self, target: _Runnable) -> None:
        """Add a child and start it; raises what its start raised (and forgets it)."""
        if self._tasks is None:
            raise RuntimeError(f"supervisor {self.name!r} is not running")
        child = _Child(target)
        self._children.append(child)
        try:
            await self._tasks.start(self._run_child, child)
        except BaseException:
            self._children.remove(child)
            raise

    async def stop_child(self, name: str) -> None:
        """Stop a child for good (it is not restarted)."""
        for child in self._children:
            if child.target.name == name:
                self._children.remove(child)
                await self._stop(child)
                return
        raise KeyError(f"supervisor {self.name!r} has no child {name!r}")

    async def _stop(self, child: _Child) -> None:
        if child.scope is not None:
            child.scope.cancel()
            await child.done.wait()

    async def _run_child(
        self, child: _Child, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        child.done = anyio.Event()
        failure: BaseException | None = None
        try:
            with anyio.CancelScope() as scope:
                child.scope = scope
                try:
                    await child.target.run(task_status=task_status)
                except (ActorCrashed, SupervisionEscalated) as error:
                    failure = error
        finally:
            child.scope = None
            child.done.set()
        if failure is not None and child in self._children:
            await self._on_failure(child, failure)

    async def _on_failure(self, child: _Child, failure: BaseException) -> None:
        async with self._lock:
            self.node.log.warning(
                "child_failed",
                supervisor=self.name,
                child=child.target.name,
                strategy=self.strategy,
                error=_describe(failure),
            )
            index = self._children.index(child)
            if self.strategy == "one_for_one":
                affected = [child]
            elif self.strategy == "one_for_all":
                affected = list(self._children)
            else:
                affected = self._children[index:]
            for other in reversed(affected):
                if other is not child:
                    await self._stop(other)
            while True:
                self._count_restart(child, failure)
                try:
                    for target in affected:
                        if target.scope is None and target in self._children:
                            assert self._tasks is not None
                            await self._tasks.start(self._run_child, target)
                            target.target.restarts += 1
                    return
                except Exception as error:  # a restart's on_start failed: that is a crash too
                    failure = error

    def _count_restart(self, child: _Child, failure: BaseException) -> None:
        now = anyio.current_time()
        self._history.append(now)
        while self._history and now - self._history[0] > self.period:
            self._history.popleft()
        if len(self._history) > self.intensity:
            self.node.log.error(
                "supervisor_escalated",
                supervisor=self.name,
                child=child.target.name,
                restarts=len(self._history),
                period=self.period,
            )
            raise SupervisionEscalated(
                f"supervisor {self.name!r} exceeded {self.intensity} restarts in "
                f"{self.period} s (last: {child.target.name!r}: {_describe(failure)})"
            ) from failure
        self.restarts += 1

    def __repr__(self) -> str:
        names = ", ".join(c.target.name for c in self._children)
        return (
            f"<Supervisor {self.name}@{self.node.name} {self.strategy} "
            f"[{len(self._children)} children: {names} | restarts {self.restarts} | "
            f"intensity {self.intensity}/{self.period}s]>"
        )


def _describe(error: BaseException) -> str:
    leaf = first_leaf(error) or error
    cause = leaf.__cause__
    text = f"{type(leaf).__name__}: {leaf}"
    return f"{text} ({type(cause).__name__}: {cause})" if cause is not None else text
