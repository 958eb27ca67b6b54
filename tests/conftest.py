from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from runtime import MemoryNetwork, Node, NodeConfig, open_node

TRANSPORTS = ["memory", "ipc", "tcp"]


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint (random weights, seeded), built once per session."""
    import torch

    from actors.tiny_model import build_tiny_checkpoint

    torch.set_num_threads(1)
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2")


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def open_pair(
    transport: str, tmp_path: Path, config: NodeConfig | None = None
) -> AsyncIterator[tuple[Node, Node]]:
    """A head and a worker node connected over ``transport``."""
    if transport == "memory":
        network: MemoryNetwork | None = MemoryNetwork()
        listen = ["mem://head", "mem://worker"]
    elif transport == "ipc":
        network = None
        listen = [f"ipc://{tmp_path}/head.sock", f"ipc://{tmp_path}/worker.sock"]
    else:
        network = None
        listen = ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]
    async with AsyncExitStack() as stack:
        head = await stack.enter_async_context(
            open_node("head", listen=listen[0], config=config, transport=network)
        )
        worker = await stack.enter_async_context(
            open_node(
                "worker", listen=listen[1], head=head.address, config=config, transport=network
            )
        )
        yield head, worker
