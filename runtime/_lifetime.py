"""How a node process knows it should stop."""

from __future__ import annotations

import signal
import sys

import anyio
import anyio.to_thread


async def wait_until_stopped() -> None:
    """Return when standard input closes (the process that started this one ended or
    let it go) or SIGTERM arrives: what a node process serves until."""
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tasks:

            async def until_stdin_closes() -> None:
                await anyio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
                tasks.cancel_scope.cancel()

            tasks.start_soon(until_stdin_closes)
            async for _ in signals:
                tasks.cancel_scope.cancel()
