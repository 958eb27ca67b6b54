"""A node process of the pipeline-under-load suite: simulated engines or the simulated
learner, joined to the driver's head node.

    python -m benchmarks.pipeline_node engines --head ADDR --model DIR --workload JSON \\
        --first 0 --count 2
    python -m benchmarks.pipeline_node learner --head ADDR --model DIR --workload JSON \\
        --config LEARNER_CONFIG_JSON

Engines register as ``engine/team/INDEX``, the learner as ``learner/team``, exactly as
``bin/launch``'s node processes do. The process prints one JSON line once it serves
and runs until its standard input closes.
"""

from __future__ import annotations

import argparse
import functools
import json

import anyio
import msgspec
import torch

from actors.engines.base import EngineActor
from actors.models import load_checkpoint
from benchmarks.pipeline_sim import SimulatedEngine, SimulatedLearner, Workload
from learner.trainer import LearnerConfig
from runtime import configure_logging, open_node, wait_until_stopped

POLICY = "team"


async def serve_engines(args: argparse.Namespace, workload: Workload) -> None:
    checkpoint = load_checkpoint(args.model)
    names = [f"engine/{POLICY}/{i}" for i in range(args.first, args.first + args.count)]
    async with open_node(names[0], listen=args.listen, head=args.head) as node:
        for index, name in enumerate(names):
            core = SimulatedEngine(checkpoint, workload, policy=POLICY, seed=args.first + index)
            await node.spawn(name, functools.partial(EngineActor, core))
        print(json.dumps({"ready": node.address, "names": names}), flush=True)
        await wait_until_stopped()


async def serve_learner(args: argparse.Namespace, workload: Workload) -> None:
    config = msgspec.json.decode(args.config, type=LearnerConfig)
    model = load_checkpoint(args.model).model
    name = f"learner/{POLICY}"
    async with open_node(name, listen=args.listen, head=args.head) as node:
        await node.spawn(name, lambda: SimulatedLearner(model, config, step_s=workload.step_s))
        print(json.dumps({"ready": node.address, "name": name}), flush=True)
        await wait_until_stopped()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["engines", "learner"])
    parser.add_argument("--head", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", required=True, help="a Workload as JSON")
    parser.add_argument("--config", default="{}", help="learner: a LearnerConfig as JSON")
    parser.add_argument("--first", type=int, default=0, help="engines: the first index")
    parser.add_argument("--count", type=int, default=1, help="engines: how many")
    parser.add_argument("--listen", default="tcp://127.0.0.1:*")
    args = parser.parse_args()
    workload = msgspec.json.decode(args.workload, type=Workload)
    torch.set_num_threads(1)
    configure_logging("warning")
    serve = serve_engines if args.kind == "engines" else serve_learner
    anyio.run(serve, args, workload, backend="trio")


if __name__ == "__main__":
    main()
