"""A learner node: one process that joins a cluster and trains one policy.

    python -m learner.serve --head tcp://10.0.0.1:5555 --model /models/Qwen3-4B \\
        --config '{"policy": "solver", "engines": ["engine/solver/0"],
                   "checkpoint_dir": "run/checkpoints/solver", "checkpoint_every": 10}'

``--config`` is a ``LearnerConfig`` as JSON (an unknown or mistyped field is an error
that names it). The learner registers as ``learner/POLICY``. Every incarnation of the
actor loads the weights from ``--model`` and then resumes from ``checkpoint_dir``, so a
restarted process continues where the killed one left off. The process prints one JSON
line (``{"ready": ..., "name": ...}``) once it serves, and runs until its standard input
closes or it is terminated.
"""

from __future__ import annotations

import argparse
import json

import anyio
import msgspec
import torch

from actors.models import check_checkpoint, load_checkpoint
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig
from runtime import configure_logging, load_cluster_keys, open_node, wait_until_stopped


async def serve(args: argparse.Namespace, config: LearnerConfig) -> None:
    name = f"learner/{config.policy}"
    keys = load_cluster_keys(args.keys) if args.keys else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    async with open_node(
        name,
        listen=args.listen,
        head=args.head,
        keys=keys,
        advertise=args.advertise or None,
    ) as node:
        await node.spawn(
            name, lambda: LearnerActor(load_checkpoint(args.model, device=device).model, config)
        )
        print(json.dumps({"ready": node.address, "name": name}), flush=True)
        await wait_until_stopped()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="the head node's address")
    parser.add_argument("--model", required=True, help="a local checkpoint directory")
    parser.add_argument("--config", required=True, help="a LearnerConfig as JSON")
    parser.add_argument("--listen", default="tcp://127.0.0.1:*")
    parser.add_argument("--keys", default="", help="the cluster's CURVE keys directory")
    parser.add_argument(
        "--advertise", default="", help="the address to register, if not the listen one"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    try:
        config = msgspec.json.decode(args.config, type=LearnerConfig)
    except msgspec.DecodeError as error:
        parser.error(f"--config: {error}")
    check_checkpoint(args.model)
    torch.set_num_threads(args.threads)
    configure_logging(args.log_level)
    anyio.run(serve, args, config, backend="trio")


if __name__ == "__main__":
    main()
