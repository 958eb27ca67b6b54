"""A worker node in a process of its own, for the multi-process tests.

It joins ``--head``, hosts a ``Journal`` actor named ``journal`` (appending to
``--journal``, taking ``--delay`` seconds per message) and a ``probe`` actor that
reports the process's resident memory and the journal's mailbox. Prints one JSON line
when ready; runs until killed or its stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import Actor, Message, NodeConfig, Request, configure_logging, open_node
from tests.sample_actors import Journal


class Probed(Message, frozen=True):
    rss_bytes: int
    mailbox: int
    in_flight: int
    handled: int


class Probe(Request[Probed], frozen=True):
    pass


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


class Prober(Actor):
    inbox = Probe

    async def handle(self, message: Probe) -> Probed:
        journal = self.node.actor_statistics("journal")
        return Probed(rss_bytes(), journal.mailbox, journal.in_flight, journal.handled)


def config() -> NodeConfig:
    return NodeConfig(heartbeat_interval=0.2, heartbeat_timeout=2.0, resend_interval=0.5)


async def serve(args: argparse.Namespace) -> None:
    async with open_node("consumer", listen=args.listen, head=args.head, config=config()) as node:
        await node.spawn("journal", lambda: Journal(Path(args.journal), args.delay))
        await node.spawn("probe", Prober)
        print(json.dumps({"ready": node.address}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    configure_logging("warning")
    anyio.run(serve, parser.parse_args(), backend="trio")
