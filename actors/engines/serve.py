"""An engine node: one process that joins a cluster and serves one policy's engine.

    python -m actors.engines.serve --head tcp://10.0.0.1:5555 --policy solver \\
        --model /models/Qwen3-4B --engine torch --threads 1

The engine registers as ``engine/POLICY/INDEX``. The process prints one JSON line
(``{"ready": ..., "name": ...}``) once it serves, and runs until its standard input
closes or it is terminated. Torch gets its thread count before any model is loaded:
on shared cores, more threads than the process may use make every step slower.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
import torch

from actors.engines.base import EngineActor, EngineCore
from actors.messages import WeightsWanted
from actors.models import check_checkpoint, load_checkpoint
from runtime import (
    ActorNotFound,
    Node,
    PeerUnavailable,
    configure_logging,
    load_cluster_keys,
    open_node,
    wait_until_stopped,
)


@asynccontextmanager
async def open_engine(
    kind: str, model: str, *, policy: str, max_batch: int
) -> AsyncIterator[EngineCore]:
    """The engine core of ``kind`` for the checkpoint at ``model``, running."""
    if kind == "torch":
        from actors.engines.torch_engine import open_torch_engine

        device = "cuda" if torch.cuda.is_available() else "cpu"
        checkpoint = await anyio.to_thread.run_sync(lambda: load_checkpoint(model, device=device))
        async with open_torch_engine(checkpoint, policy=policy, max_batch=max_batch) as core:
            yield core
    elif kind == "vllm":
        from actors.engines.vllm_engine import open_vllm_engine

        async with open_vllm_engine(model, policy=policy, max_batch=max_batch) as core:
            yield core
    else:
        raise ValueError(f"--engine must be torch or vllm, got {kind!r}")


async def serve(args: argparse.Namespace) -> None:
    check_checkpoint(args.model)
    name = f"engine/{args.policy}/{args.index}"
    keys = load_cluster_keys(args.keys) if args.keys else None
    async with (
        open_node(
            name,
            listen=args.listen,
            head=args.head,
            keys=keys,
            advertise=args.advertise or None,
        ) as node,
        open_engine(args.engine, args.model, policy=args.policy, max_batch=args.max_batch) as core,
        anyio.create_task_group() as tasks,
    ):
        await node.spawn(name, lambda: EngineActor(core))
        print(json.dumps({"ready": node.address, "name": name}), flush=True)
        if args.learner:
            tasks.start_soon(ask_for_weights, node, name, args.learner)
        await wait_until_stopped()
        tasks.cancel_scope.cancel()


async def ask_for_weights(node: Node, engine: str, learner: str) -> None:
    """Tell ``learner`` this engine started, so that it sends its current weights if it
    has trained past the ones loaded (a restarted process); it may start after the
    engine, so this waits up to 600 s for it to register."""
    try:
        await node.send(await node.lookup(learner, timeout=600), WeightsWanted(engine))
    except (ActorNotFound, PeerUnavailable) as error:
        node.log.warning("weights_not_asked_for", learner=learner, error=repr(error))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="the head node's address")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--model", required=True, help="a local checkpoint directory")
    parser.add_argument("--engine", default="torch", choices=["torch", "vllm"])
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--listen", default="tcp://127.0.0.1:*")
    parser.add_argument("--keys", default="", help="the cluster's CURVE keys directory")
    parser.add_argument(
        "--advertise", default="", help="the address to register, if not the listen one"
    )
    parser.add_argument("--learner", default="", help="the learner to ask for weights")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--max-batch", type=int, default=64, help="rows decoded together")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configure_logging(args.log_level)
    anyio.run(serve, args, backend="trio")


if __name__ == "__main__":
    main()
